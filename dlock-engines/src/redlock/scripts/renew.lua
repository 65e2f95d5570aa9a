-- Extend this owner's hold.
-- KEYS[1]  the lock key; ARGV[1] owner, ARGV[2] PX in ms
-- returns  1 if extended, 2 if extended and the owner was asked to let go
--          here (control.lua: the ask then lives as long as the lease),
--          0 if the lock is not ours here
if string.sub(redis.call('GET', KEYS[1]) or '', 1, 32) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local noted = KEYS[1] .. ':o'
if redis.call('HEXISTS', noted, 'r:' .. ARGV[1]) == 0 then
  return 1
end
if redis.call('PTTL', noted) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', noted, ARGV[2])
end
return 2
