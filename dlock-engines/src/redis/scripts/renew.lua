-- Extend this owner's lease, whether it holds for write or for read.
-- ARGV[2]  lease, ms
-- returns  1 if extended, 0 if this owner no longer holds the lock

-- A lone writer: its gate expires the retention past its deadline.
local value = redis.call('GET', gate)
if value and string.byte(value, 26) == 126 and string.sub(value, 27, 58) == me then
  local retention = tonumber(string.sub(value, 15, 25), 16)
  if redis.call('PTTL', gate) > retention then
    redis.call('PEXPIRE', gate, ARGV[2] + retention)
    return 1
  end
  return 0
end
-- helpers --
local lease = tonumber(ARGV[2])
local now_ms = millis(redis.call('TIME'))
local holder, deadline, last, crowded = read_gate(now_ms)
-- Nobody else around: no readers either.
if not crowded then
  return 0
end
local _, readers, _, settle = crowd()
if owns(holder) then
  settle(holder, now_ms + lease, last, now_ms)
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
