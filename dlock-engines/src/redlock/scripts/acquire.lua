-- Take the lock on this master; see take.lua, which comes before this.
-- KEYS[1]  the lock key, KEYS[2] its fence counter
-- ARGV[1]  owner, ARGV[2] PX in ms, ARGV[3] fence retention in ms,
-- ARGV[4]  the record's tail
return take(KEYS[1], KEYS[2], ARGV[1], ARGV[4], ARGV[2], ARGV[3])
