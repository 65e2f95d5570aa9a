-- Let go (release), or withdraw a request whatever became of it (cancel);
-- then, if the lock is free and a live writer heads the queue, hand the lock
-- straight to it (it learns the grant from the notification, without a
-- round trip), else wake the waiter now first in line.
-- KEYS[1]  the lock's prefix
-- ARGV[1]  owner id
-- ARGV[2]  "release" or "cancel"
-- ARGV[3]  the publish command: "PUBLISH" (one server) or "SPUBLISH" (cluster)
-- ARGV[4]  how long the last fencing token is kept after the lock goes idle, ms
-- returns  1 if this owner held the lock, 0 if not
local p = KEYS[1]
local queue, writer, readers, pending, fence_key = p .. ':q', p .. ':w', p .. ':r', p .. ':p', p .. ':f'
local me, publish, retain = ARGV[1], ARGV[3], tonumber(ARGV[4])
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
elseif redis.call('EXISTS', readers) == 1 then
  local time = redis.call('TIME')
  local deadline = tonumber(redis.call('ZSCORE', readers, me))
  if deadline then
    redis.call('ZREM', readers, me)
    if deadline > time[1] * 1000 + math.floor(time[2] / 1000) then
      held = 1
    end
  end
end
if redis.call('EXISTS', queue) == 0 then
  return held
end

local time = redis.call('TIME')
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
local head = redis.call('LINDEX', queue, 0)
-- Waiters whose liveness key is gone are dead: drop them from the head.
while head and redis.call('EXISTS', p .. ':a:' .. string.sub(head, 3)) == 0 do
  redis.call('LPOP', queue)
  head = redis.call('LINDEX', queue, 0)
end
if not head then
  return held
end
local owner = string.sub(head, 3)
local free = redis.call('EXISTS', writer) == 0 and redis.call('SCARD', pending) == 0
  and redis.call('ZCOUNT', readers, now_ms + 1, '+inf') == 0
if free and string.sub(head, 1, 2) == 'w:' then
  -- Granted for the waiter's remaining liveness only: if it died since its
  -- last poll the lock frees as fast as a dead waiter would be kicked; a live
  -- one extends to its own lease as soon as it claims the grant.
  local alive = p .. ':a:' .. owner
  local window = redis.call('PTTL', alive)
  redis.call('LPOP', queue)
  redis.call('DEL', alive)
  redis.call('SET', writer, owner, 'PX', window)
  -- Same fencing as acquire.lua (scripts cannot share code): server-clock
  -- microseconds, bumped past the last token while that is kept.
  local now_us = time[1] * 1000000 + time[2]
  local last = redis.call('SET', fence_key, string.format('%d', now_us), 'PX', retain, 'GET')
  local fence = now_us
  if last and tonumber(last) >= now_us then
    fence = tonumber(last) + 1
    redis.call('SET', fence_key, string.format('%d', fence), 'PX', retain)
  end
  redis.call(publish, p .. ':n', owner .. ':' .. string.format('%d', fence))
else
  redis.call(publish, p .. ':n', owner)
end
return held
