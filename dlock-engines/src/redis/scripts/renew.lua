-- Extend this owner's lease, whether it holds for write or for read.
-- KEYS[1]  the lock's prefix
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms (ARGV[3], the publish command, is unused here)
-- returns  1 if extended, 0 if this owner no longer holds the lock
local p = KEYS[1]
local writer, readers = p .. ':w', p .. ':r'
local me, lease = ARGV[1], tonumber(ARGV[2])
if redis.call('GET', writer) == me then
  redis.call('PEXPIRE', writer, lease)
  return 1
end
local time = redis.call('TIME')
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
local deadline = tonumber(redis.call('ZSCORE', readers, me))
if deadline and deadline > now_ms then
  redis.call('ZADD', readers, 'XX', now_ms + lease, me)
  if redis.call('PTTL', readers) < lease then
    redis.call('PEXPIRE', readers, lease)
  end
  return 1
end
return 0
