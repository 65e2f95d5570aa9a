-- Who holds and who waits, read in one call and changing nothing.
-- KEYS[1]  a lock's gate `<prefix>:w`, or a semaphore's record `<prefix>:s`
-- returns  {count, records}: a semaphore's count ('' for a lock or an
--          unknown count), and one
--          {role, mode, owner, fence, since, ends, label} per holder (role
--          'h') and live waiter ('w', first in line first), in the stored
--          hex, '' where a field is not kept (see head.lua and
--          semaphore.lua for the forms)
local key = KEYS[1]
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
local out = {}

-- A record `<fence> <since> <label>`, or nothing.
local function add(role, mode, owner, ends, record)
  local fence, since, label = string.match(record or '', '^(%x+) (%x+) (.*)$')
  if role == 'w' then
    fence = ''
  end
  out[#out + 1] = {role, mode, owner, fence or '', since or '', ends, label or ''}
end

-- The live members of a sorted set scored by deadline, each with the
-- record kept in hash `records` under `field` and its id.
local function holders(set, mode, records, field)
  local held = redis.call('ZRANGEBYSCORE', set, '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #held, 2 do
    add('h', mode, held[i], string.format('%x', held[i + 1]), redis.call('HGET', records, field .. held[i]))
  end
end

if string.sub(key, -2) == ':s' then
  holders(key .. ':h', 'w', key, 'i:')
  for _, owner in ipairs(redis.call('LRANGE', key .. ':q', 0, -1)) do
    if redis.call('EXISTS', key .. ':a:' .. owner) == 1 then
      add('w', 'w', owner, '', redis.call('HGET', key, 'i:' .. owner))
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
      string.format('%x', deadline), string.sub(value, 70)}
  end
end
holders(p .. ':r', 'r', info, '')
-- Readers admitted with another, yet to claim their hold: first in line.
for _, owner in ipairs(redis.call('SMEMBERS', p .. ':p')) do
  if redis.call('EXISTS', p .. ':a:' .. owner) == 1 then
    add('w', 'r', owner, '', redis.call('HGET', info, owner))
  end
end
for _, entry in ipairs(redis.call('LRANGE', p .. ':q', 0, -1)) do
  local owner = string.sub(entry, 3)
  if redis.call('EXISTS', p .. ':a:' .. owner) == 1 then
    add('w', string.sub(entry, 1, 1), owner, '', redis.call('HGET', info, owner))
  end
end
return {'', out}
