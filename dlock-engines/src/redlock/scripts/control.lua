-- An operator acts on this master's copy of a hold: forces it out
-- ("force") or asks its owner to let go ("revoke"). The owner is noted in
-- `<key>:o`, as `f:<owner>` or `r:<owner>`, for as long as its lease runs
-- here: what its renewal (renew.lua) or its question after a failed one
-- (forced.lua) reads. The fence counter is left as it is.
-- KEYS[1]  the lock key; ARGV[1] "force" or "revoke"
-- ARGV[2]  the owner id whose hold to act on; empty: whoever holds here
-- returns  1 if a hold was here, else 0
local value = redis.call('GET', KEYS[1])
if not value or (ARGV[2] ~= '' and string.sub(value, 1, 32) ~= ARGV[2]) then
  return 0
end
local noted, ttl = KEYS[1] .. ':o', redis.call('PTTL', KEYS[1])
redis.call('HSET', noted, (ARGV[1] == 'force' and 'f:' or 'r:') .. string.sub(value, 1, 32), 1)
if redis.call('PTTL', noted) < ttl then
  redis.call('PEXPIRE', noted, ttl)
end
if ARGV[1] == 'force' then
  redis.call('DEL', KEYS[1])
end
return 1
