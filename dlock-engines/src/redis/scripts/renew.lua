-- Extend this owner's lease, whether it holds for write or for read.
-- ARGV[4]  lease, ms
-- returns  1 if extended, 0 if this owner no longer holds the lock
local lease = tonumber(ARGV[4])
local value = redis.call('GET', gate)
if value == me then
  redis.call('PEXPIRE', gate, lease)
  return 1
end
if not value or not string.find(value, '|', 1, true) then
  return 0
end
local now_ms = millis(redis.call('TIME'))
local holder, deadline = writer(value, now_ms)
if holder == me then
  settle(me, now_ms + lease, now_ms)
  return 1
end
local until_ms = tonumber(redis.call('ZSCORE', readers, me))
if until_ms and until_ms > now_ms then
  redis.call('ZADD', readers, 'XX', now_ms + lease, me)
  if redis.call('PTTL', readers) < lease then
    redis.call('PEXPIRE', readers, lease)
  end
  settle(holder, deadline, now_ms)
  return 1
end
return 0
