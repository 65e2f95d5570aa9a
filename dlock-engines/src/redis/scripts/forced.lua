-- Whether the caller, found no longer holding the lock, was forced out
-- (control.lua): 1 or 0. Asked once per hold, so the note goes with the answer.
-- KEYS[1]  the lock's gate
-- ARGV[1]  the caller's owner id
return redis.call('HDEL', string.sub(KEYS[1], 1, -3) .. ':o', 'f:' .. ARGV[1])
