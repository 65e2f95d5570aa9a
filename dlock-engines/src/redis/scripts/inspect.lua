-- Who holds and who waits, read in one call and changing nothing.
-- KEYS     locks' gates `<prefix>:w`, or semaphores' records `<prefix>:s`:
--          one for an inspect, a SCAN's batch for a listing (all on one
--          node: in a cluster, of one slot)
-- returns  one {count, records} per key: a semaphore's count ('' for a
--          lock or an unknown count), and one
--          {role, mode, owner, fence, since, ends, label, slot} per holder
--          (role 'h') and live waiter ('w', first in line first), in the
--          stored hex (a permit's slot in decimal), '' where a field is not
--          kept (see head.lua and semaphore.lua for the forms; label is the
--          label's reference)
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)

-- A record `<fence> <since> <label>`, or nothing, added to `out`, with a
-- permit's slot.
local function add(out, role, mode, owner, ends, record, slot)
  local fence, since, label = string.match(record or '', '^(%x+) (%x+) (.*)$')
  if role == 'w' then
    fence = ''
  end
  out[#out + 1] = {role, mode, owner, fence or '', since or '', ends, label or '', slot or ''}
end

-- The live members of a sorted set scored by deadline, each with the
-- record kept in hash `records` under `field` and its id, and for a
-- semaphore's (`slots`) the slot kept under `s:` and the id.
local function holders(out, set, mode, records, field, slots)
  local held = redis.call('ZRANGEBYSCORE', set, '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #held, 2 do
    local slot = slots and redis.call('HGET', records, 's:' .. held[i])
    add(out, 'h', mode, held[i], string.format('%x', held[i + 1]), redis.call('HGET', records, field .. held[i]), slot)
  end
end

local function inspect(key)
  local out = {}
  if string.sub(key, -2) == ':s' then
    holders(out, key .. ':h', 'w', key, 'i:', true)
    for _, owner in ipairs(redis.call('LRANGE', key .. ':q', 0, -1)) do
      if redis.call('EXISTS', key .. ':a:' .. owner) == 1 then
        add(out, 'w', 'w', owner, '', redis.call('HGET', key, 'i:' .. owner))
      end
    end
    return {redis.call('HGET', key, 'n') or '', out}
  end

  local p = string.sub(key, 1, -3)
  local info = p .. ':i'
  local value = redis.call('GET', key)
  if value and #value >= 58 then
    local sep, deadline = string.byte(value, 26), tonumber(string.sub(value, 15, 25), 16)
    if sep == 126 then
      deadline = now + redis.call('PTTL', key) - deadline
    end
    if deadline > now then
      out[1] = {'h', 'w', string.sub(value, 27, 58), string.sub(value, 1, 14), string.sub(value, 59, 69),
        string.format('%x', deadline), string.sub(value, 70), ''}
    end
  end
  -- A gate with nobody else about is the whole lock: readers, the readers
  -- admitted together and the queue are read only if any exists.
  if redis.call('EXISTS', p .. ':r', p .. ':p', p .. ':q') == 0 then
    return {'', out}
  end
  holders(out, p .. ':r', 'r', info, '')
  -- Readers admitted with another, yet to claim their hold: first in line.
  for _, owner in ipairs(redis.call('SMEMBERS', p .. ':p')) do
    if redis.call('EXISTS', p .. ':a:' .. owner) == 1 then
      add(out, 'w', 'r', owner, '', redis.call('HGET', info, owner))
    end
  end
  for _, entry in ipairs(redis.call('LRANGE', p .. ':q', 0, -1)) do
    local owner = string.sub(entry, 3)
    if redis.call('EXISTS', p .. ':a:' .. owner) == 1 then
      add(out, 'w', string.sub(entry, 1, 1), owner, '', redis.call('HGET', info, owner))
    end
  end
  return {'', out}
end

local replies = {}
for i, key in ipairs(KEYS) do
  replies[i] = inspect(key)
end
return replies
