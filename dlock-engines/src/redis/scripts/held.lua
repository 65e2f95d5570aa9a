-- A held write: after the hold's renewal, made the function `renewed` (the
-- lock's renew.lua or the semaphore's script, as the engine puts it), the
-- caller's writes, only if it still holds: in one script, so no write
-- lands once the hold has ended, nor lands without the hold's check.
-- `writes_from`, set before, is where the writes begin in ARGV.
-- KEYS[2…]  the keys written, one per write
-- ARGV[writes_from…] each write: its command (SET, HSET, DEL), how many
--           arguments follow its key, and those
-- returns  0 if the caller no longer holds (nothing written), else 1
if renewed() == 0 then
  return 0
end
local at = writes_from
for k = 2, #KEYS do
  local command, count = ARGV[at], tonumber(ARGV[at + 1])
  redis.call(command, KEYS[k], unpack(ARGV, at + 2, at + 1 + count))
  at = at + 2 + count
end
return 1
