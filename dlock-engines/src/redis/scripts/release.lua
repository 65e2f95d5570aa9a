-- Let go (release), or withdraw a request whatever became of it (cancel);
-- then wake the waiter now first in line.
-- KEYS[1]  the lock's prefix
-- ARGV[1]  owner id
-- ARGV[2]  "release" or "cancel"
-- ARGV[3]  the publish command: "PUBLISH" (one server) or "SPUBLISH" (cluster)
-- returns  1 if this owner held the lock, 0 if not
local p = KEYS[1]
local queue, writer, readers, pending = p .. ':q', p .. ':w', p .. ':r', p .. ':p'
local me = ARGV[1]
if ARGV[2] == 'cancel' then
  redis.call('LREM', queue, 0, 'w:' .. me)
  redis.call('LREM', queue, 0, 'r:' .. me)
  redis.call('SREM', pending, me)
  redis.call('DEL', p .. ':a:' .. me)
end
local held = 0
if redis.call('GET', writer) == me then
  redis.call('DEL', writer)
  held = 1
else
  local time = redis.call('TIME')
  local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
  local deadline = tonumber(redis.call('ZSCORE', readers, me))
  if deadline then
    redis.call('ZREM', readers, me)
    if deadline > now_ms then
      held = 1
    end
  end
end
-- Wake only the waiter now first in line (its id after `w:` / `r:`), not the herd.
local head = redis.call('LINDEX', queue, 0)
if head then
  redis.call(ARGV[3], p .. ':n', string.sub(head, 3))
end
return held
