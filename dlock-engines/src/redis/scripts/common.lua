-- The helpers, past each script's lone-writer path (see head.lua).
local p = string.sub(gate, 1, -3)
local info = p .. ':i'

local function millis(time)
  return time[1] * 1000 + math.floor(time[2] / 1000)
end

-- The gate's live writer (nil if none, or if its deadline has passed: the
-- id and its record, see head.lua) and its deadline, the last token (0 if
-- none), and whether others may be around.
local function read_gate(now_ms)
  local value = redis.call('GET', gate)
  if not value then
    return nil, 0, 0, false
  end
  local sep, deadline, holder = string.byte(value, 26), tonumber(string.sub(value, 15, 25), 16)
  if sep == 126 then
    deadline = now_ms + redis.call('PTTL', gate) - deadline
  end
  if deadline > now_ms then
    holder = string.sub(value, 27)
  end
  return holder, deadline, tonumber(string.sub(value, 1, 14), 16), sep == 124
end

-- Whether `holder`, a writer as read_gate gives it, is the caller.
local function owns(holder)
  return holder ~= nil and string.sub(holder, 1, 32) == me
end

-- Write the gate for the writer (or nil), the last token, and others whose
-- keys live `others` ms more (none: <= 0).
local function put(holder, deadline, fence, now_ms, others)
  if holder and others <= 0 then
    local value = string.format('%014x%011x~%s', fence, retain, holder)
    redis.call('SET', gate, value, 'PX', string.format('%d', deadline - now_ms + retain))
    return
  end
  local ttl = math.max(others, retain)
  if holder then
    ttl = math.max(ttl, deadline - now_ms + retain)
  else
    holder, deadline = '', 0
  end
  local value = string.format('%014x%011x%s%s', fence, deadline, others > 0 and '|' or '.', holder)
  redis.call('SET', gate, value, 'PX', string.format('%d', ttl))
end

-- Fencing without a key that lives forever: microseconds of the server
-- clock, bumped past the last token while the gate keeps it (see the
-- engine docs). A lone writer's path counts up from the last token instead.
local function next_fence(time, last)
  return math.max(time[1] * 1000000 + time[2], last + 1)
end

-- The keys of the queue, the readers and the pending readers, and what
-- works on them. Every call of a script makes anew what is defined at its
-- top level, so the lone-holder paths, which need none of it, call this
-- only once past them.
local function crowd()
  local queue, readers, pending = p .. ':q', p .. ':r', p .. ':p'

  -- Rewrite the gate for the writer (or nil) and whatever else is left;
  -- the others' records live as long as they do.
  local function settle(holder, deadline, fence, now_ms)
    local last = 0
    for _, key in ipairs({queue, readers, pending}) do
      last = math.max(last, redis.call('PTTL', key))
    end
    if last > 0 then
      redis.call('PEXPIRE', info, last)
    else
      redis.call('DEL', info)
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
      redis.call('HDEL', info, string.sub(head, 3))
      head = redis.call('LINDEX', queue, 0)
    end
    return head
  end

  -- The lock is let go of (`holder` nil) or still held: if it is free
  -- and a live writer heads the queue, hand it straight to that writer (it
  -- learns the grant from the notification, without a round trip), else
  -- wake the waiter now first in line. Returns the gate's writer,
  -- deadline and last token after.
  local function pass_on(holder, deadline, last, time, now_ms)
    local head, engine, lease = live_head(nil)
    if not head then
      return holder, deadline, last
    end
    local owner = string.sub(head, 3)
    local free = not holder and redis.call('SCARD', pending) == 0
      and redis.call('ZCOUNT', readers, now_ms + 1, '+inf') == 0
    if not (free and string.sub(head, 1, 2) == 'w:') then
      wake(engine, owner)
      return holder, deadline, last
    end
    -- Granted for the waiter's lease, as any grant, or less: for what is
    -- left of its liveness window, if that ends sooner, so a waiter that
    -- died since its last poll frees the lock as fast as it would be kicked.
    -- Its client counts the shorter of the two from that poll, never past
    -- this deadline.
    -- Its record moves into the gate, granted now; a waiter of an older
    -- dlock, with no record, is written as its id alone, as it expects.
    local alive, record = p .. ':a:' .. owner, redis.call('HGET', info, owner)
    holder = owner
    if record then
      holder = string.format('%s%011x%s', owner, now_ms, string.match(record, '^%x+ %x+ (.*)$'))
      redis.call('HDEL', info, owner)
    end
    deadline = now_ms + math.min(lease, math.max(redis.call('PTTL', alive), 1))
    last = next_fence(time, last)
    redis.call('LPOP', queue)
    redis.call('DEL', alive)
    wake(engine, owner .. ':' .. string.format('%d', last))
    return holder, deadline, last
  end

  return queue, readers, pending, settle, wake, live_head, waiter, pass_on
end
