-- Let go (release), or withdraw a request whatever became of it (cancel);
-- then, if the lock is free and a live writer heads the queue, hand the lock
-- straight to it (it learns the grant from the notification, without a
-- round trip), else wake the waiter now first in line.
-- ARGV[4]  "release" or "cancel"
-- returns  1 if this owner held the lock, 0 if not
local holder, deadline, last, crowded, value = read_gate(0)
-- A lone writer: nobody else to think of; the record keeps the token. The
-- gate expires at the later of the deadline and the token's retention
-- (see put), so its PTTL tells the time without TIME; when the retention
-- is the later, it is also when the idle record must go.
if holder == me and not crowded then
  local kept = math.floor(last / 1000) + retain
  local now_ms = math.max(deadline, kept) - redis.call('PTTL', gate)
  if deadline > now_ms then
    if deadline <= kept then
      redis.call('SET', gate, string.sub(value, 1, 14) .. '00000000000.', 'KEEPTTL')
    else
      put(nil, nil, last, now_ms, 0)
    end
    return 1
  end
end
local time = redis.call('TIME')
local now_ms = millis(time)
if deadline <= now_ms then
  holder = nil
end
-- The TTL's time can run a ms ahead of TIME's (more if an engine with a
-- shorter retention wrote the gate): then TIME decides.
if holder == me and not crowded then
  put(nil, nil, last, now_ms, 0)
  return 1
end
local queue, readers, pending, settle, wake, live_head = crowd()
if ARGV[4] == 'cancel' then
  redis.call('LREM', queue, 0, 'w:' .. me)
  redis.call('LREM', queue, 0, 'r:' .. me)
  redis.call('SREM', pending, me)
  redis.call('DEL', p .. ':a:' .. me)
end
-- Nobody else around: neither a queue nor readers to think of.
if not crowded then
  return 0
end

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

local head, engine, lease = live_head(nil)
if head then
  local owner = string.sub(head, 3)
  local free = not holder and redis.call('SCARD', pending) == 0
    and redis.call('ZCOUNT', readers, now_ms + 1, '+inf') == 0
  if free and string.sub(head, 1, 2) == 'w:' then
    -- Granted for the waiter's lease, as any grant, or less: for what is
    -- left of its liveness window, if that ends sooner, so a waiter that
    -- died since its last poll frees the lock as fast as it would be kicked.
    -- Its client counts the shorter of the two from that poll, never past
    -- this deadline.
    local alive = p .. ':a:' .. owner
    holder, deadline = owner, now_ms + math.min(lease, math.max(redis.call('PTTL', alive), 1))
    last = next_fence(time, last)
    redis.call('LPOP', queue)
    redis.call('DEL', alive)
    wake(engine, owner .. ':' .. string.format('%d', last))
  else
    wake(engine, owner)
  end
end
settle(holder, deadline, last, now_ms)
return held
