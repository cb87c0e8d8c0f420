"""The Lua scripts of the Redis backend (proxy.state.redis): each does in one round
trip, atomically, what would otherwise take several. Digests are 16 bytes, passed concatenated."""

# KEYS: none. ARGV: prefix, concatenated 16-byte digests. The 1-based number of digests of the
# longest prefix with a checkpoint of that cut, or 0.
LONGEST = """
local digests = ARGV[2]
local size = 16
for cut = #digests / size, 1, -1 do
  local key = ARGV[1] .. string.sub(digests, (cut - 1) * size + 1, cut * size)
  local stored = redis.call('HGET', key, 'cut')
  if stored and tonumber(stored) == cut then return cut end
end
return 0
"""
# The same walk over lock keys: the number of digests of the newest prefix being compacted.
HOLDER = """
local digests = ARGV[2]
local size = 16
for cut = #digests / size, 1, -1 do
  if redis.call('EXISTS', ARGV[1] .. string.sub(digests, (cut - 1) * size + 1, cut * size)) == 1
  then return cut end
end
return 0
"""
# KEYS: checkpoint. ARGV: cut, body, ttl ms, channel, notice. First writer wins.
PUT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'cut', ARGV[1], 'body', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"""
# KEYS: lock, fence counter. ARGV: ttl ms. The fencing id, or nil while someone holds the lock.
ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return nil end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], fence, 'PX', ARGV[1])
return fence
"""
# KEYS: lock. ARGV: fencing id, ttl ms.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: lock. ARGV: fencing id, channel, notice.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""
