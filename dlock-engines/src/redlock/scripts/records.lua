-- A lock's or a semaphore's records on this master, read in one call.
-- KEYS[1]  a lock's key, or a semaphore's count key
-- ARGV[1]  '' for a lock; for a semaphore, its slots' stem (`<stem><i>`)
-- returns  {count, value, pttl, ...}: the semaphore's count here ('' for a
--          lock or none), then each key's value ('' if none) and its PTTL
--          in ms, the lock's key or the count's slots in order
if ARGV[1] == '' then
  return {'', redis.call('GET', KEYS[1]) or '', tostring(redis.call('PTTL', KEYS[1]))}
end
local count = redis.call('GET', KEYS[1])
local out = {count or ''}
for i = 0, (tonumber(count) or 0) - 1 do
  out[#out + 1] = redis.call('GET', ARGV[1] .. i) or ''
  out[#out + 1] = tostring(redis.call('PTTL', ARGV[1] .. i))
end
return out
