-- Let go (release), or withdraw a request whatever became of it (cancel);
-- then, if the lock is free and a live writer heads the queue, hand the lock
-- straight to it (it learns the grant from the notification, without a
-- round trip), else wake the waiter now first in line.
-- ARGV[4]  "release" or "cancel"
-- returns  1 if this owner held the lock, 0 if not
local value = redis.call('GET', gate)
-- A lone writer: nobody else to think of.
if value == me then
  redis.call('DEL', gate)
  return 1
end
if ARGV[4] == 'cancel' then
  redis.call('LREM', queue, 0, 'w:' .. me)
  redis.call('LREM', queue, 0, 'r:' .. me)
  redis.call('SREM', pending, me)
  redis.call('DEL', p .. ':a:' .. me)
end
-- Without `|` in the gate there is neither a queue nor readers to think of.
if not value or not string.find(value, '|', 1, true) then
  return 0
end

local time = redis.call('TIME')
local now_ms = millis(time)
local holder, deadline = writer(value, now_ms)
local held = 0
if holder == me then
  holder = nil
  held = 1
else
  local until_ms = tonumber(redis.call('ZSCORE', readers, me))
  if until_ms then
    redis.call('ZREM', readers, me)
    if until_ms > now_ms then
      held = 1
    end
  end
end

local head, engine = live_head(nil)
if head then
  local owner = string.sub(head, 3)
  local free = not holder and redis.call('SCARD', pending) == 0
    and redis.call('ZCOUNT', readers, now_ms + 1, '+inf') == 0
  if free and string.sub(head, 1, 2) == 'w:' then
    -- Granted for the waiter's remaining liveness only: if it died since its
    -- last poll the lock frees as fast as a dead waiter would be kicked; a live
    -- one renews to its own lease soon after (the grant says how long it lasts).
    local alive = p .. ':a:' .. owner
    holder, deadline = owner, now_ms + math.max(redis.call('PTTL', alive), 1)
    redis.call('LPOP', queue)
    redis.call('DEL', alive)
    wake(engine, owner .. ':' .. string.format('%d', next_fence(time)))
  else
    wake(engine, owner)
  end
end
settle(holder, deadline, now_ms)
return held
