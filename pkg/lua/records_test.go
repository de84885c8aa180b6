package lua

import (
	"testing"
	"time"
)

func TestRecordsReadBackAsWritten(t *testing.T) {
	cases := []struct {
		name   string
		record string // as stored
		want   StoredRecord
	}{
		{"a TTL alone, as the first versions wrote", "120000", StoredRecord{TTL: 2 * time.Minute}},
		{"a caller, as the trust version wrote", "10000;caller=chat-api", StoredRecord{TTL: 10 * time.Second, Record: Record{Caller: "chat-api"}}},
		{"every field", "3000;started=1712345678901;caller=chat-api;plan=paid;label=pod-7",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 1712345678901, Record: Record{Caller: "chat-api", Plan: "paid", Label: "pod-7"}}},
		{"a label holding the separators runs to the end", "3000;started=5;label=a;caller=b=c;label=d",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Record: Record{Label: "a;caller=b=c;label=d"}}},
		{"a field a later version adds is skipped", "3000;started=5;queue=2;plan=free", StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Record: Record{Plan: "free"}}},
		{"no record", "", StoredRecord{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ParseRecord(tc.record); got != tc.want {
				t.Errorf("ParseRecord(%q) = %+v, want %+v", tc.record, got, tc.want)
			}
		})
	}
}

func TestRecordEncodeLeavesEmptyFieldsOutAndTheLabelLast(t *testing.T) {
	cases := []struct {
		rec  Record
		want string
	}{
		{Record{}, ""},
		{Record{Caller: "chat-api"}, ";caller=chat-api"},
		{Record{Plan: "free", Label: "m;x=y"}, ";plan=free;label=m;x=y"},
		{Record{Caller: "c", Plan: "p", Label: "l"}, ";caller=c;plan=p;label=l"},
	}
	for _, tc := range cases {
		got := tc.rec.encode()
		if got != tc.want {
			t.Errorf("%+v.encode() = %q, want %q", tc.rec, got, tc.want)
		}
		if back := ParseRecord("100;started=1" + got).Record; back != tc.rec {
			t.Errorf("%+v read back as %+v", tc.rec, back)
		}
	}
}
