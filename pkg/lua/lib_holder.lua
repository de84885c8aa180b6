-- holder(record): the caller a slot's (or a ticket's) record names, ''
-- when none. The caller field comes before the label, which may hold any
-- character, so only the part before ';label=' is read.
local function holder(record)
  if not record then
    return ''
  end
  local head = string.match(record, '^(.-);label=') or record
  return string.match(head, ';caller=([^;]*)') or ''
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
