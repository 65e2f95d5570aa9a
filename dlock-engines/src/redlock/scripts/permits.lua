-- A permit of a semaphore on this master: one of N slot keys, each taken
-- like a lock (take.lua, which comes before this); beside them the count
-- in use and the fence counter.
-- KEYS[1]  the count key, KEYS[2] the slot key, KEYS[3] the fence counter
-- ARGV[1]  'acquire', 'renew' or 'release'; ARGV[2] owner; ARGV[3] count;
-- ARGV[4]  PX in ms; ARGV[5] fence retention in ms; ARGV[6] the slot keys'
--          stem (`<stem><i>`: the slots of another count are not in KEYS,
--          which masters that are not a cluster allow); ARGV[7] the
--          record's tail (see take.lua)
-- returns  acquire: the candidate token as take.lua, 0 if the slot is
--          another's, -M if the semaphore is in use here with M permits;
--          renew: 2 if the slot is ours and its holder was asked to let
--          go, 1 if ours, else 0; release: 1 if the slot was ours, else 0
local op, owner, count, px = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

-- Whether any of the first n slots is held here.
local function held(n)
  for i = 0, n - 1 do
    if redis.call('EXISTS', ARGV[6] .. i) == 1 then
      return true
    end
  end
  return false
end

-- The count lives at least as long as any permit taken or renewed.
local function keep_count()
  if redis.call('PTTL', KEYS[1]) < px then
    redis.call('SET', KEYS[1], count, 'PX', px)
  end
end

if op == 'acquire' then
  local in_use = tonumber(redis.call('GET', KEYS[1]))
  -- A count no held slot bears out is stale: it gives way.
  if in_use and in_use ~= count and held(in_use) then
    return -in_use
  end
  if in_use ~= count then
    redis.call('SET', KEYS[1], count, 'PX', px)
  else
    keep_count()
  end
  return take(KEYS[2], KEYS[3], owner, ARGV[7], px, ARGV[5])
end

if string.sub(redis.call('GET', KEYS[2]) or '', 1, 32) ~= owner then
  return 0
end
if op == 'renew' then
  redis.call('PEXPIRE', KEYS[2], px)
  keep_count()
  -- Asked to let go: an operator's note beside the slot (control.lua).
  return 1 + redis.call('HEXISTS', KEYS[2] .. ':o', 'r:' .. owner)
end
redis.call('DEL', KEYS[2])
if not held(count) and tonumber(redis.call('GET', KEYS[1])) == count then
  redis.call('DEL', KEYS[1])
end
return 1
