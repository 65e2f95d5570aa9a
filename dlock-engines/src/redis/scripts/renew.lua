-- Extend this owner's lease, whether it holds for write or for read.
-- ARGV[4]  lease, ms
-- returns  1 if extended, 0 if this owner no longer holds the lock
local lease = tonumber(ARGV[4])
local now_ms = millis(redis.call('TIME'))
local holder, deadline, last, crowded = read_gate(now_ms)
if holder == me and not crowded then
  put(me, now_ms + lease, last, now_ms, 0)
  return 1
elseif not crowded then
  -- Nobody else around: no readers either.
  return 0
end
local _, readers, _, settle = crowd()
if holder == me then
  settle(me, now_ms + lease, last, now_ms)
  return 1
end
local until_ms = tonumber(redis.call('ZSCORE', readers, me))
if until_ms and until_ms > now_ms then
  redis.call('ZADD', readers, 'XX', now_ms + lease, me)
  if redis.call('PTTL', readers) < lease then
    redis.call('PEXPIRE', readers, lease)
  end
  settle(holder, deadline, last, now_ms)
  return 1
end
return 0
