-- Takes `key` for `owner` on this master (or finds it already the owner's:
-- a retry after a lost reply) for `px` ms, and moves the fence counter
-- `counter` to its candidate token in the same step: the counter is only
-- ever written by a holder. Returns 0 if another owner holds the key; else
-- the candidate token: the counter + 1, or, where there is no counter
-- (first use, expired, master restarted empty), the server clock in µs, so
-- a newer holder's token still comes out greater. Kept `retention` ms.
-- The key's value is the hold's record, `<owner> <token> <tail>` (`tail`:
-- when it was asked for and the label, see records.rs): so a permit's
-- token, which the shared counter does not keep, can be read back.
local function take(key, counter, owner, tail, px, retention)
  local last = redis.call('GET', counter)
  local token
  if last then
    token = tonumber(last) + 1
  else
    local time = redis.call('TIME')
    token = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  local value = string.format('%s %d %s', owner, token, tail)
  if not redis.call('SET', key, value, 'NX', 'PX', px) then
    if string.sub(redis.call('GET', key), 1, 32) ~= owner then
      return 0
    end
    redis.call('SET', key, value, 'PX', px)
  end
  redis.call('SET', counter, string.format('%d', token), 'PX', retention)
  return token
end
