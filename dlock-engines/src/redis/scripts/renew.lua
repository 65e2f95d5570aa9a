-- Extend this owner's lease, whether it holds for write or for read.
-- ARGV[2]  lease, ms
-- returns  1 if extended, 2 if extended and this owner was asked to let go
--          (control.lua), 0 if this owner no longer holds the lock

-- 1, or 2 if this owner was asked to let go: the ask then lives as long
-- as its lease.
local function held()
  local noted = string.sub(gate, 1, -3) .. ':o'
  if redis.call('HEXISTS', noted, 'r:' .. me) == 0 then
    return 1
  end
  if redis.call('PTTL', noted) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', noted, ARGV[2])
  end
  return 2
end

-- A lone writer: its gate expires the retention past its deadline.
local value = redis.call('GET', gate)
if value and string.byte(value, 26) == 126 and string.sub(value, 27, 58) == me then
  local retention = tonumber(string.sub(value, 15, 25), 16)
  if redis.call('PTTL', gate) > retention then
    redis.call('PEXPIRE', gate, ARGV[2] + retention)
    return held()
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
  return held()
end
local until_ms = tonumber(redis.call('ZSCORE', readers, me))
if until_ms and until_ms > now_ms then
  redis.call('ZADD', readers, 'XX', now_ms + lease, me)
  if redis.call('PTTL', readers) < lease then
    redis.call('PEXPIRE', readers, lease)
  end
  settle(holder, deadline, last, now_ms)
  return held()
end
return 0
