-- Write the chosen token back, only while this owner still holds the lock
-- here, and keep it for the fence retention; the hold's record (see
-- take.lua) names it too, so a majority of records agree on it.
-- KEYS[1]  the lock key, KEYS[2] its fence counter
-- ARGV[1]  owner, ARGV[2] token, ARGV[3] retention in ms
-- returns  1 if written (or already higher), 0 if the lock is not ours here
local record = redis.call('GET', KEYS[1])
if string.sub(record or '', 1, 32) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], string.gsub(record, '^(%S+) %S+', '%1 ' .. ARGV[2]), 'KEEPTTL')
if tonumber(ARGV[2]) > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
