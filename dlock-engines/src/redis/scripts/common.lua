-- Prepended to every script (scripts cannot call each other).
-- KEYS[1]  the lock's prefix, `{dlock:<group>:<name>}`; every key below shares its hash tag
-- ARGV[1]  the caller's owner id
-- ARGV[2]  the publish command: "PUBLISH" (one server) or "SPUBLISH" (cluster)
-- ARGV[3]  how long the last fencing token is kept after its grant, ms
-- ARGV[4…] the script's own
--
-- The gate `:w` is the lock's record: it exists whenever any part of the
-- lock does, and it carries the last fencing token, so an idle lock is
-- taken and a lone holder lets go each with one GET and one SET. Its value
-- is `<fence><deadline><sep><owner>`, fixed-width so it is read without a
-- pattern: the last token in 14 hex digits (server µs), the writer's
-- deadline in 11 (server ms; 0 without a writer), `.` when nobody else is
-- around or `|` when others may be, and the writer's id (empty without):
--   `<fence><deadline>.<owner>`  a writer holds until <deadline>, nobody
--                                else is around (once it passes, nobody holds);
--   `<fence><deadline>|<owner>`  the same, and others wait or read;
--   `<fence>00000000000|`        no writer; readers hold or waiters wait;
--   `<fence>00000000000.`        idle: only the last token is left.
-- It lives until the writer's deadline, the token's retention and the
-- others' keys have all run out. Every script that changes the queue, the
-- readers or the pending readers ends with `settle`, which keeps that promise.
local p = KEYS[1]
local gate = p .. ':w'
local me, publish, retain = ARGV[1], ARGV[2], tonumber(ARGV[3])

local function millis(time)
  return time[1] * 1000 + math.floor(time[2] / 1000)
end

-- The gate's live writer (nil if none; at `now_ms` 0, whoever it names)
-- and its deadline, the last token (0 if none), whether others may be
-- around, and the value itself.
local function read_gate(now_ms)
  local value = redis.call('GET', gate)
  if not value then
    return nil, 0, 0, false
  end
  local deadline, holder = tonumber(string.sub(value, 15, 25), 16)
  if deadline > now_ms then
    holder = string.sub(value, 27)
  end
  return holder, deadline, tonumber(string.sub(value, 1, 14), 16), string.byte(value, 26) == 124, value
end

-- Write the gate for the writer (or nil), the last token, and others whose
-- keys live `others` ms more (none: <= 0). Without others, it expires at
-- the later of the deadline and the token's retention, to the ms: the
-- release of a lone writer reads the time from that.
local function put(holder, deadline, fence, now_ms, others)
  local ttl = math.max(others, math.floor(fence / 1000) + retain - now_ms)
  if holder then
    ttl = math.max(ttl, deadline - now_ms)
  else
    holder, deadline = '', 0
  end
  if ttl <= 0 then
    redis.call('DEL', gate)
    return
  end
  local value = string.format('%014x%011x%s%s', fence, deadline, others > 0 and '|' or '.', holder)
  redis.call('SET', gate, value, 'PX', string.format('%d', ttl))
end

-- Fencing without a key that lives forever: microseconds of the server
-- clock, bumped past the last token while the gate keeps it (see the
-- engine docs).
local function next_fence(time, last)
  return math.max(time[1] * 1000000 + time[2], last + 1)
end

-- The keys of the queue, the readers and the pending readers, and what
-- works on them. Every call of a script makes anew what is defined at its
-- top level, so the lone-holder paths, which need none of it, call this
-- only once past them.
local function crowd()
  local queue, readers, pending = p .. ':q', p .. ':r', p .. ':p'

  -- Rewrite the gate for the writer (or nil) and whatever else is left.
  local function settle(holder, deadline, fence, now_ms)
    local last = 0
    for _, key in ipairs({queue, readers, pending}) do
      last = math.max(last, redis.call('PTTL', key))
    end
    put(holder, deadline, fence, now_ms, last)
  end

  -- A waiter's liveness key holds `<lease ms> <engine id>`: the lease it
  -- asked for, which a handed-over grant lasts, and its engine, whose
  -- channel for this lock (`:n:<engine>`) is where that waiter hears from
  -- the lock. Nil if the waiter is gone.
  local function waiter(owner)
    local value = redis.call('GET', p .. ':a:' .. owner)
    if value then
      local lease, engine = string.match(value, '^(%d+) (.+)$')
      return engine, tonumber(lease)
    end
  end

  local function wake(engine, message)
    redis.call(publish, p .. ':n:' .. engine, message)
  end

  -- Drop waiters whose liveness key is gone (they died) from the head of the
  -- queue, stopping at `keep` (the caller's own entry); returns the new head,
  -- its engine and its lease.
  local function live_head(keep)
    local head = redis.call('LINDEX', queue, 0)
    while head and head ~= keep do
      local engine, lease = waiter(string.sub(head, 3))
      if engine then
        return head, engine, lease
      end
      redis.call('LPOP', queue)
      head = redis.call('LINDEX', queue, 0)
    end
    return head
  end

  return queue, readers, pending, settle, wake, live_head, waiter
end
