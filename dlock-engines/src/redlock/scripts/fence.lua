-- Write the chosen token back, only while this owner still holds the lock
-- here, and keep it for the fence retention.
-- KEYS[1]  the lock key, KEYS[2] its fence counter
-- ARGV[1]  owner, ARGV[2] token, ARGV[3] retention in ms
-- returns  1 if written (or already higher), 0 if the lock is not ours here
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
