-- Extend this owner's hold.
-- KEYS[1]  the lock key; ARGV[1] owner, ARGV[2] PX in ms
-- returns  1 if extended, 0 if the lock is not ours here
if string.sub(redis.call('GET', KEYS[1]) or '', 1, 32) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
