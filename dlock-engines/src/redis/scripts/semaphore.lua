-- A semaphore: every call, one script. After the engine's settings line
-- (`publish`, `retain`, `waiter_ttl`; see head.lua).
-- KEYS[1]  the record `<prefix>:s`, a hash: `n`, the count its holders and
--          waiters use; `f`, the last fencing token; `i:<owner>`, each
--          holder's and waiter's record, `<fence> <since> <label>` (hex,
--          fence 0 while waiting, since in server ms); `s:<owner>`, each
--          holder's slot, the lowest no live holder had. Beside it, under the
--          same hash tag: `:s:h`, the holders (a sorted set scored by each
--          one's deadline, server ms), `:s:q`, the queue (a list of owner
--          ids), `:s:a:<owner>`, each queued waiter's liveness key (`<lease
--          ms> <engine id>`), and the channels `:s:n:<engine>`.
-- ARGV[1]  the caller's owner id
-- ARGV[2]  "acquire", "renew", "release" or "cancel"; an operator's
--          "force" or "revoke" (the caller's id then empty)
-- ARGV[3]  acquire: the count asked for; renew: the lease, ms
-- ARGV[4]  acquire: the lease, ms
-- ARGV[5]  acquire: "1" to join the queue if not granted, "0" to try once
-- ARGV[6]  acquire: the caller's engine id
-- ARGV[7]  acquire: the caller's label
-- returns  acquire: {fence, 0, slot} when granted (fence > 0); {0, ms, -1}
--          when not, ms until the first holder's lease ends (-1: no
--          holder), when a waiter should look again unless woken first;
--          {-count in use, 0, -1} when the caller's count differs. Renew:
--          2 if the caller holds and was asked to let go, 1 if it holds, 0
--          if not. Release and cancel: 1 if the caller held a permit, 0 if
--          not
--
-- The record carries the count only while a holder or waiter lives: an
-- idle semaphore takes whatever count comes next. The record outlives the
-- last holder by the retention, for the token.
local record, me, op = KEYS[1], ARGV[1], ARGV[2]
local holders, queue = record .. ':h', record .. ':q'
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)

-- Holders whose lease ended go, with their records.
local function drop_expired()
  for _, owner in ipairs(redis.call('ZRANGEBYSCORE', holders, '-inf', now)) do
    redis.call('ZREM', holders, owner)
    redis.call('HDEL', record, 'i:' .. owner, 's:' .. owner)
  end
end

-- The lowest slot no live holder has.
local function free_slot()
  local live, used = redis.call('ZRANGEBYSCORE', holders, '(' .. now, '+inf'), {}
  if #live > 0 then
    local fields = {}
    for i, owner in ipairs(live) do
      fields[i] = 's:' .. owner
    end
    for _, slot in ipairs(redis.call('HMGET', record, unpack(fields))) do
      if slot then
        used[tonumber(slot)] = true
      end
    end
  end
  local slot = 0
  while used[slot] do
    slot = slot + 1
  end
  return slot
end

-- With nobody queued (an empty list does not exist, and a queued caller is
-- in it), an acquire that finds a free permit and a release need neither
-- the queue nor a helper (Lua makes a script's functions anew on every
-- call), so they come first. The record then lives the retention past
-- the holders.
if (op == 'acquire' or op == 'release') and redis.call('EXISTS', queue) == 0 then
  if op == 'release' then
    drop_expired()
    local held = redis.call('ZREM', holders, me)
    redis.call('HDEL', record, 'i:' .. me, 's:' .. me)
    redis.call('PEXPIRE', record, math.max(redis.call('PTTL', holders), 0) + retain)
    return held
  end
  local n, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
  local kept = redis.call('HMGET', record, 'n', 'f')
  local in_use, count = tonumber(kept[1]), redis.call('ZCOUNT', holders, '(' .. now, '+inf')
  if in_use and in_use ~= n and count > 0 then
    return {-in_use, 0, -1}
  end
  if count < n then
    local fence = math.max(time[1] * 1000000 + time[2], (tonumber(kept[2]) or 0) + 1)
    local slot = free_slot()
    redis.call('HSET', record, 'n', n, 'f', string.format('%d', fence),
      'i:' .. me, string.format('%x %x %s', fence, now, ARGV[7]), 's:' .. me, slot)
    -- With no live holder, the holders' key lives no longer than its dead.
    local ttl = count > 0 and redis.call('PTTL', holders) or 0
    redis.call('ZADD', holders, now + lease, me)
    if ttl < lease then
      redis.call('PEXPIRE', holders, lease)
      ttl = lease
    end
    redis.call('PEXPIRE', record, ttl + retain)
    return {fence, 0, slot}
  end
end
drop_expired()

local function alive(owner)
  return record .. ':a:' .. owner
end

-- The first `free` live waiters, dead ones dropped on the way.
local function first_live(free)
  while free > 0 do
    local first, dead = redis.call('LRANGE', queue, 0, free - 1), false
    for _, owner in ipairs(first) do
      if owner ~= me and redis.call('EXISTS', alive(owner)) == 0 then
        redis.call('LREM', queue, 1, owner)
        redis.call('HDEL', record, 'i:' .. owner)
        dead = true
      end
    end
    if not dead then
      return first
    end
  end
  return {}
end

local function free_permits()
  return (tonumber(redis.call('HGET', record, 'n')) or 0) - redis.call('ZCARD', holders)
end

-- Wakes, on its own engine's channel, each waiter a free permit awaits.
local function wake_next()
  for _, owner in ipairs(first_live(free_permits())) do
    local value = redis.call('GET', alive(owner))
    if value then
      redis.call(publish, record .. ':n:' .. string.match(value, ' (.+)$'), owner)
    end
  end
end

-- Keeps the record the retention past whatever else lives.
local function settle()
  local last = math.max(redis.call('PTTL', holders), redis.call('PTTL', queue), 0)
  redis.call('PEXPIRE', record, last + retain)
end

-- An operator forces holders out ("force") or asks them to let go
-- ("revoke"): those named in ARGV[3..] (only.lua), or every one. Each is
-- noted, as a lock's holder is, in the lock's hash `:o` beside this record,
-- `f:<owner>` or `r:<owner>`, while its lease would run: a renewal reads
-- `r:`, and a holder found gone asks after `f:` (forced.lua). A forced
-- holder's permit goes to the next waiter. Returns how many it reached.
if op == 'force' or op == 'revoke' then
  local admitted, noted = holds_named(3), string.sub(record, 1, -3) .. ':o'
  local mark, reached, longest = op == 'force' and 'f:' or 'r:', 0, 0
  local live = redis.call('ZRANGEBYSCORE', holders, '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    local owner = live[i]
    local fence = string.match(redis.call('HGET', record, 'i:' .. owner) or '', '^(%x+) ')
    if admitted(owner, fence and tonumber(fence, 16)) then
      redis.call('HSET', noted, mark .. owner, 1)
      longest = math.max(longest, tonumber(live[i + 1]) - now)
      reached = reached + 1
      if op == 'force' then
        redis.call('ZREM', holders, owner)
        redis.call('HDEL', record, 'i:' .. owner, 's:' .. owner)
      end
    end
  end
  if reached > 0 then
    if redis.call('PTTL', noted) < longest then
      redis.call('PEXPIRE', noted, longest)
    end
    if op == 'force' then
      wake_next()
    end
    settle()
  end
  return reached
end

if op == 'acquire' then
  local n, lease, join = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
  local queued = redis.call('EXISTS', alive(me)) == 1
  local in_use = tonumber(redis.call('HGET', record, 'n'))
  if in_use ~= n then
    -- Held or awaited with another count: refused, unless everyone who
    -- gave it is gone (the dead waiters are dropped to see).
    first_live(redis.call('LLEN', queue))
    if in_use and (redis.call('ZCARD', holders) > 0 or redis.call('LLEN', queue) > 0) then
      return {-in_use, 0, -1}
    end
    redis.call('HSET', record, 'n', n)
  end
  local free = n - redis.call('ZCARD', holders)
  local first = first_live(free)
  local granted = false
  if queued then
    for _, owner in ipairs(first) do
      granted = granted or owner == me
    end
  else
    granted = #first < free
  end
  if not granted then
    if join then
      if not queued then
        redis.call('RPUSH', queue, me)
        redis.call('HSET', record, 'i:' .. me, string.format('0 %x %s', now, ARGV[7]))
      end
      redis.call('SET', alive(me), ARGV[4] .. ' ' .. ARGV[6], 'PX', waiter_ttl)
      if redis.call('PTTL', queue) < waiter_ttl * 2 then
        redis.call('PEXPIRE', queue, waiter_ttl * 2)
      end
      settle()
    end
    local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
    return {0, first[2] and (tonumber(first[2]) - now + 1) or -1, -1}
  end
  if queued then
    redis.call('LREM', queue, 1, me)
    redis.call('DEL', alive(me))
  end
  local fence = math.max(time[1] * 1000000 + time[2], (tonumber(redis.call('HGET', record, 'f')) or 0) + 1)
  local slot = free_slot()
  redis.call('HSET', record, 'f', string.format('%d', fence), 'i:' .. me, string.format('%x %x %s', fence, now, ARGV[7]),
    's:' .. me, slot)
  redis.call('ZADD', holders, now + lease, me)
  if redis.call('PTTL', holders) < lease then
    redis.call('PEXPIRE', holders, lease)
  end
  settle()
  return {fence, 0, slot}
end

if op == 'renew' then
  local lease = tonumber(ARGV[3])
  if not redis.call('ZSCORE', holders, me) then
    return 0
  end
  redis.call('ZADD', holders, 'XX', now + lease, me)
  if redis.call('PTTL', holders) < lease then
    redis.call('PEXPIRE', holders, lease)
  end
  settle()
  return 1 + redis.call('HEXISTS', string.sub(record, 1, -3) .. ':o', 'r:' .. me)
end

-- release or cancel
if op == 'cancel' then
  redis.call('LREM', queue, 1, me)
  redis.call('DEL', alive(me))
end
local held = redis.call('ZREM', holders, me)
redis.call('HDEL', record, 'i:' .. me, 's:' .. me)
wake_next()
settle()
return held
