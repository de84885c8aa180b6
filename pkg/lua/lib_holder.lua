-- holder(record): the caller a slot's (or a ticket's) record names, ''
-- when none. The caller is the first field after the TTL and start (see
-- pkg/lua/records.go), so only that place is read: fields after it (a
-- user id, a label) may hold any character, ';caller=' too.
local function holder(record)
  if not record then
    return ''
  end
  return string.match(record, '^%d*;started=%d+;caller=([^;]*)')
    or string.match(record, '^%d*;caller=([^;]*)') or ''
end

-- foreign(record, caller): whether the record names a caller other than
-- caller. A call with no caller (an open API) and a record with none (a
-- slot taken while the API was open) are nobody's: never foreign.
local function foreign(record, caller)
  if caller == '' then
    return false
  end
  local h = holder(record)
  return h ~= '' and h ~= caller
end
