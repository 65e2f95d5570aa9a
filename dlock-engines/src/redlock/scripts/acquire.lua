-- Take the lock on this master (or find it already ours: a retry after a
-- lost reply), and move this master's fence counter to its candidate
-- token, in the same step: the counter is only ever written by a holder.
-- KEYS[1]  the lock key, KEYS[2] its fence counter
-- ARGV[1]  owner, ARGV[2] PX in ms, ARGV[3] fence retention in ms
-- returns  0 if another owner holds it; else the candidate token: the
--          counter + 1, or, where there is no counter (first use, expired,
--          master restarted empty), the server clock in µs, so a newer
--          holder's token still comes out greater
local mine = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not mine then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local counter = redis.call('GET', KEYS[2])
local token
if counter then
  token = tonumber(counter) + 1
else
  local time = redis.call('TIME')
  token = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[3])
return token
