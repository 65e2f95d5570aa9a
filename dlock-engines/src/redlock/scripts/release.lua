-- Let go, only if this owner holds the lock here.
-- KEYS[1]  the lock key; ARGV[1] owner
-- returns  1 if deleted, 0 if the lock is not ours here
if string.sub(redis.call('GET', KEYS[1]) or '', 1, 32) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
