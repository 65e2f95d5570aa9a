-- Acquire or poll: take the lock if this request's turn has come, else keep
-- its place in the queue alive. Kicks dead waiters off the head of the queue.
-- Publishes `*` on the lock's channel when it admits a run of queued readers.
-- KEYS[1]  the lock's prefix, `{dlock:<group>:<name>}`; every key below shares its hash tag
-- ARGV[1]  owner id
-- ARGV[2]  mode: "w" or "r"
-- ARGV[3]  lease, ms
-- ARGV[4]  waiter liveness ttl, ms
-- ARGV[5]  "1": join the queue if not granted; "0": try once
-- ARGV[6]  how long the last fencing token is kept after the lock goes idle, ms
-- ARGV[7]  the publish command: "PUBLISH" (one server) or "SPUBLISH" (cluster)
-- returns  {1, fence} when granted, {0, kicked} when not
local p = KEYS[1]
local queue, writer, readers, pending, fence_key = p .. ':q', p .. ':w', p .. ':r', p .. ':p', p .. ':f'
local me, mode = ARGV[1], ARGV[2]
local lease, waiter_ttl, retain = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local alive = p .. ':a:' .. me
local entry = mode .. ':' .. me
-- Fencing without a key that lives forever: microseconds of the server clock,
-- bumped past the last token while that is kept (see the engine docs).
local function next_fence(time)
  local now_us = time[1] * 1000000 + time[2]
  local last = redis.call('SET', fence_key, string.format('%d', now_us), 'PX', retain, 'GET')
  if last and tonumber(last) >= now_us then
    local fence = tonumber(last) + 1
    redis.call('SET', fence_key, string.format('%d', fence), 'PX', retain)
    return fence
  end
  return now_us
end

-- Fast path: nobody holds, waits or is admitted, so a writer takes it at once
-- (one call fewer than the general path: each call from Lua costs ~1.5 us).
if mode == 'w' and redis.call('EXISTS', queue, writer, readers, pending) == 0 then
  redis.call('SET', writer, me, 'PX', lease)
  return {1, next_fence(redis.call('TIME'))}
end
local head = redis.call('LINDEX', queue, 0)

local time = redis.call('TIME')
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)

-- A release handed this waiter the lock (see release.lua) and its
-- notification went astray: it holds already; a fresh fence serves.
if mode == 'w' and redis.call('GET', writer) == me then
  redis.call('PEXPIRE', writer, lease)
  return {1, next_fence(time)}
end

-- Readers expire one by one: each score is that reader's own deadline.
redis.call('ZREMRANGEBYSCORE', readers, '-inf', now_ms)

-- A waiter whose liveness key is gone has died: drop it from the head and from pending.
local kicked = 0
while head and head ~= entry and redis.call('EXISTS', p .. ':a:' .. string.sub(head, 3)) == 0 do
  redis.call('LPOP', queue)
  kicked = kicked + 1
  head = redis.call('LINDEX', queue, 0)
end
for _, owner in ipairs(redis.call('SMEMBERS', pending)) do
  if owner ~= me and redis.call('EXISTS', p .. ':a:' .. owner) == 0 then
    redis.call('SREM', pending, owner)
    kicked = kicked + 1
  end
end

local first = head == entry or (not head and redis.call('SISMEMBER', pending, me) == 0)
local granted
if redis.call('EXISTS', writer) == 1 then
  granted = false
elseif mode == 'w' then
  granted = first and redis.call('ZCARD', readers) == 0 and redis.call('SCARD', pending) == 0
else
  granted = first or redis.call('SISMEMBER', pending, me) == 1
end

if not granted then
  if ARGV[5] == '1' then
    if redis.call('EXISTS', alive) == 0 and redis.call('SISMEMBER', pending, me) == 0 then
      redis.call('RPUSH', queue, entry)
    end
    redis.call('SET', alive, '1', 'PX', waiter_ttl)
    if redis.call('PTTL', queue) < waiter_ttl * 2 then
      redis.call('PEXPIRE', queue, waiter_ttl * 2)
    end
  end
  return {0, kicked}
end

if head == entry then
  redis.call('LPOP', queue)
end
redis.call('SREM', pending, me)
redis.call('DEL', alive)
if mode == 'w' then
  redis.call('SET', writer, me, 'PX', lease)
else
  redis.call('ZADD', readers, now_ms + lease, me)
  if redis.call('PTTL', readers) < lease then
    redis.call('PEXPIRE', readers, lease)
  end
  -- ylock's pending readers: the run of readers queued right behind this one
  -- is admitted with it, instead of one head per poll.
  local admitted = 0
  while true do
    local next = redis.call('LINDEX', queue, 0)
    if not next or string.sub(next, 1, 2) ~= 'r:' then
      break
    end
    redis.call('LPOP', queue)
    redis.call('SADD', pending, string.sub(next, 3))
    admitted = admitted + 1
  end
  if admitted > 0 then
    redis.call('PEXPIRE', pending, waiter_ttl * 2)
    redis.call(ARGV[7], p .. ':n', '*')
  end
end

return {1, next_fence(time)}
