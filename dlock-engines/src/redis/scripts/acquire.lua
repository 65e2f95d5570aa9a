-- Acquire or poll: take the lock if this request's turn has come, else keep
-- its place in the queue alive. Kicks dead waiters off the head of the queue.
-- Publishes `*` to the engines of a run of queued readers it admits.
-- ARGV[2]  mode: "w" or "r"
-- ARGV[3]  lease, ms
-- ARGV[4]  "1": join the queue if not granted; "0": try once
-- ARGV[5]  the caller's engine id
-- ARGV[6]  the caller's label, for its record
-- returns  the fence when granted (always > 0), 0 when not: a number is
--          cheaper to return than a table

-- A writer finds the lock idle, or its lone writer's lease over: one read,
-- the clock for the record, and one write; the token one past the last,
-- or the clock when the gate is gone.
if ARGV[2] == 'w' then
  local value = redis.call('GET', gate)
  local sep = value and string.byte(value, 26)
  if not value or sep == 46
    or (sep == 126 and redis.call('PTTL', gate) <= tonumber(string.sub(value, 15, 25), 16)) then
    local time, fence = redis.call('TIME')
    if value then
      fence = tonumber(string.sub(value, 1, 14), 16) + 1
    else
      fence = time[1] * 1000000 + time[2]
    end
    local since = time[1] * 1000 + math.floor(time[2] / 1000)
    redis.call('SET', gate, string.format('%014x%011x~%s%011x%s', fence, retain, me, since, ARGV[6]),
      'PX', ARGV[3] + retain)
    return fence
  end
end
-- helpers --
local mode, lease = ARGV[2], tonumber(ARGV[3])
local time = redis.call('TIME')
local now_ms = millis(time)
local holder, deadline, last, crowded = read_gate(now_ms)

local queue, readers, pending, settle, wake, live_head, waiter = crowd()

-- A release handed this waiter the lock (see release.lua) and its
-- notification went astray: it holds already; a fresh fence serves.
if mode == 'w' and owns(holder) then
  local fence = next_fence(time, last)
  settle(holder, now_ms + lease, fence, now_ms)
  return fence
end

-- Readers expire one by one: each score is that reader's own deadline.
for _, owner in ipairs(redis.call('ZRANGEBYSCORE', readers, '-inf', now_ms)) do
  redis.call('ZREM', readers, owner)
  redis.call('HDEL', info, owner)
end

local alive = p .. ':a:' .. me
local entry = mode .. ':' .. me
local head = live_head(entry)
-- Pending readers hold back writers alone: a writer drops the dead ones.
if mode == 'w' then
  for _, owner in ipairs(redis.call('SMEMBERS', pending)) do
    if redis.call('EXISTS', p .. ':a:' .. owner) == 0 then
      redis.call('SREM', pending, owner)
    end
  end
end

local first = head == entry or (not head and redis.call('SISMEMBER', pending, me) == 0)
local granted
if holder then
  granted = false
elseif mode == 'w' then
  granted = first and redis.call('ZCARD', readers) == 0 and redis.call('SCARD', pending) == 0
else
  granted = first or redis.call('SISMEMBER', pending, me) == 1
end

if not granted then
  if ARGV[4] == '1' then
    if redis.call('EXISTS', alive) == 0 and redis.call('SISMEMBER', pending, me) == 0 then
      redis.call('RPUSH', queue, entry)
      redis.call('HSET', info, me, string.format('0 %x %s', now_ms, ARGV[6]))
    end
    redis.call('SET', alive, ARGV[3] .. ' ' .. ARGV[5], 'PX', waiter_ttl)
    if redis.call('PTTL', queue) < waiter_ttl * 2 then
      redis.call('PEXPIRE', queue, waiter_ttl * 2)
    end
    settle(holder, deadline, last, now_ms)
  end
  -- A try that fails only dropped the dead: the gate still covers the rest.
  return 0
end

if head == entry then
  redis.call('LPOP', queue)
end
redis.call('SREM', pending, me)
redis.call('DEL', alive)
local fence = next_fence(time, last)
if mode == 'w' then
  redis.call('HDEL', info, me)
  settle(string.format('%s%011x%s', me, now_ms, ARGV[6]), now_ms + lease, fence, now_ms)
  return fence
end

redis.call('ZADD', readers, now_ms + lease, me)
redis.call('HSET', info, me, string.format('%x %x %s', fence, now_ms, ARGV[6]))
if redis.call('PTTL', readers) < lease then
  redis.call('PEXPIRE', readers, lease)
end
-- ylock's pending readers: the run of readers queued right behind this one
-- is admitted with it, instead of one head per poll; each of their engines
-- hears it once.
local engines, admitted = {}, false
local queued = redis.call('LINDEX', queue, 0)
while queued and string.sub(queued, 1, 2) == 'r:' do
  redis.call('LPOP', queue)
  local owner = string.sub(queued, 3)
  redis.call('SADD', pending, owner)
  admitted = true
  local engine = waiter(owner)
  if engine then
    engines[engine] = true
  end
  queued = redis.call('LINDEX', queue, 0)
end
if admitted then
  redis.call('PEXPIRE', pending, waiter_ttl * 2)
end
for engine in pairs(engines) do
  wake(engine, '*')
end
settle(nil, nil, fence, now_ms)
return fence
