-- Let go (release), or withdraw a request whatever became of it (cancel);
-- then pass the lock on (`pass_on` in common.lua).
-- ARGV[2]  "release" or "cancel"
-- ARGV[3]  the token this owner was granted, 14 hex digits; empty if none
-- returns  1 if this owner held the lock, 0 if not

-- A lone writer lets go: the gate becomes idle, keeping the token, with one
-- write that returns what it replaced. Not this writer's after all: put it
-- back as it was, and go the long way.
local ttl = ARGV[3] ~= '' and redis.call('PTTL', gate) or 0
if ttl > 0 then
  local value = redis.call('SET', gate, ARGV[3] .. '00000000000.', 'PX', retain, 'GET')
  if value and string.byte(value, 26) == 126 and string.sub(value, 27, 58) == me
    and string.sub(value, 1, 14) == ARGV[3] then
    -- Held until the end if the gate had more left than the retention.
    if ttl > tonumber(string.sub(value, 15, 25), 16) then
      return 1
    end
    return 0
  end
  if value then
    redis.call('SET', gate, value, 'PX', ttl)
  else
    redis.call('DEL', gate)
  end
end
-- helpers --
local time = redis.call('TIME')
local now_ms = millis(time)
local holder, deadline, last, crowded = read_gate(now_ms)
if owns(holder) and not crowded then
  put(nil, nil, last, now_ms, 0)
  return 1
end
local queue, readers, pending, settle, _, _, _, pass_on = crowd()
if ARGV[2] == 'cancel' then
  redis.call('LREM', queue, 0, 'w:' .. me)
  redis.call('LREM', queue, 0, 'r:' .. me)
  redis.call('SREM', pending, me)
  redis.call('DEL', p .. ':a:' .. me)
  redis.call('HDEL', info, me)
end
-- Nobody else around: neither a queue nor readers to think of.
if not crowded then
  return 0
end

local held = 0
if owns(holder) then
  holder = nil
  held = 1
else
  local until_ms = tonumber(redis.call('ZSCORE', readers, me))
  if until_ms then
    redis.call('ZREM', readers, me)
    redis.call('HDEL', info, me)
    if until_ms > now_ms then
      held = 1
    end
  end
end

holder, deadline, last = pass_on(holder, deadline, last, time, now_ms)
settle(holder, deadline, last, now_ms)
return held
