-- Whether this owner, found no longer holding the lock, was forced out
-- here (control.lua). Asked once per hold, so the note goes with the answer.
-- KEYS[1]  the lock key; ARGV[1] owner
-- returns  1 or 0
return redis.call('HDEL', KEYS[1] .. ':o', 'f:' .. ARGV[1])
