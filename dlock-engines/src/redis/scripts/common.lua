-- Prepended to every script (scripts cannot call each other).
-- KEYS[1]  the lock's prefix, `{dlock:<group>:<name>}`; every key below shares its hash tag
-- ARGV[1]  the caller's owner id
-- ARGV[2]  the publish command: "PUBLISH" (one server) or "SPUBLISH" (cluster)
-- ARGV[3]  how long the last fencing token is kept after the lock goes idle, ms
-- ARGV[4…] the script's own
--
-- The gate `:w` exists whenever any part of the lock does, so an idle lock
-- is taken with one `SET NX` and a lone holder lets go with `GET` + `DEL`:
--   `<owner>`             a writer holds and nobody else is around; the
--                         key's own expiry is its lease;
--   `<owner>|<deadline>`  a writer holds until <deadline> (server ms) and
--                         others wait or read: the key outlives them all;
--   `|0`                  no writer; readers hold or waiters wait.
-- Every script that changes the queue, the readers or the pending readers
-- ends with `settle`, which keeps that promise.
local p = KEYS[1]
local gate, queue, readers, pending, fence_key = p .. ':w', p .. ':q', p .. ':r', p .. ':p', p .. ':f'
local me, publish, retain = ARGV[1], ARGV[2], tonumber(ARGV[3])

local function millis(time)
  return time[1] * 1000 + math.floor(time[2] / 1000)
end

-- The live writer and its deadline, from the gate's value; nil if none.
local function writer(value, now_ms)
  if not value then
    return nil
  end
  local bar = string.find(value, '|', 1, true)
  if not bar then
    local ttl = redis.call('PTTL', gate)
    if ttl > 0 then
      return value, now_ms + ttl
    end
    return nil
  end
  local deadline = tonumber(string.sub(value, bar + 1))
  if bar > 1 and deadline > now_ms then
    return string.sub(value, 1, bar - 1), deadline
  end
  return nil
end

-- Rewrite the gate for the writer (or nil) and whatever else is left.
local function settle(holder, deadline, now_ms)
  local last = 0
  for _, key in ipairs({queue, readers, pending}) do
    last = math.max(last, redis.call('PTTL', key))
  end
  if last <= 0 and holder then
    redis.call('SET', gate, holder, 'PX', deadline - now_ms)
  elseif last <= 0 then
    redis.call('DEL', gate)
  elseif holder then
    redis.call('SET', gate, holder .. '|' .. deadline, 'PX', math.max(last, deadline - now_ms))
  else
    redis.call('SET', gate, '|0', 'PX', last)
  end
end

-- Fencing without a key that lives forever: microseconds of the server
-- clock, bumped past the last token while that is kept (see the engine docs).
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

-- A waiter's liveness key holds the id of its engine, whose channel for
-- this lock (`:n:<engine>`) is where that waiter hears from the lock.
local function wake(engine, message)
  redis.call(publish, p .. ':n:' .. engine, message)
end

-- Drop waiters whose liveness key is gone (they died) from the head of the
-- queue, stopping at `keep` (the caller's own entry); returns the new head
-- and its engine.
local function live_head(keep)
  local head = redis.call('LINDEX', queue, 0)
  while head and head ~= keep do
    local engine = redis.call('GET', p .. ':a:' .. string.sub(head, 3))
    if engine then
      return head, engine
    end
    redis.call('LPOP', queue)
    head = redis.call('LINDEX', queue, 0)
  end
  return head
end
