package keys

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestValidateUserID(t *testing.T) {
	cases := []struct {
		name string
		id   string
		ok   bool
	}{
		{"a plain id", "user-42", true},
		{"an email", "ana@example.com", true},
		{"unicode letters", "ユーザー", true},
		{"exactly 256 bytes", strings.Repeat("a", 256), true},
		{"a closing brace would move the hash tag", "a}b", false},
		{"braces around an id", "{x}", false},
		{"an opening brace", "a{b", false},
		{"empty would be one global bucket", "", false},
		{"257 bytes", strings.Repeat("a", 257), false},
		{"a space", "a b", false},
		{"a newline", "a\nb", false},
		{"a NUL", "a\x00b", false},
		{"a tab", "a\tb", false},
		{"invalid UTF-8", "a\xffb", false},
		{"a non-breaking space", "a\u00a0b", false},
		{"a DEL control character", "a\x7fb", false},
		{"format: a zero-width space reads as another id", "us\u200ber-42", false},
		{"format: a bidirectional override", "a\u202eb", false},
		{"format: a byte order mark", "\ufeffuser-42", false},
		{"format: a soft hyphen", "a\u00adb", false},
		{"format: a tag character", "a\U000E0041b", false},
		{"invisible: a Hangul filler reads as another id", "alice\u3164", false},
		{"invisible: a halfwidth Hangul filler", "alice\uffa0", false},
		{"invisible: a Hangul choseong filler", "alice\u115f", false},
		{"invisible: a Hangul jungseong filler", "alice\u1160", false},
		{"invisible: a combining grapheme joiner", "alice\u034f", false},
		{"invisible: a Khmer inherent vowel", "alice\u17b4", false},
		{"invisible: an emoji variation selector", "alice\ufe0f", false},
		{"invisible: a Mongolian variation selector", "alice\u180b", false},
		{"invisible: a supplementary variation selector", "alice\U000E0100", false},
		{"invisible: a braille blank", "alice\u2800", false},
		{"letters and an emoji", "ユーザー-😀", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateUserID(tc.id)
			if tc.ok && err != nil {
				t.Fatalf("ValidateUserID(%q) = %v, want nil", tc.id, err)
			}
			if !tc.ok && !errors.Is(err, ErrInvalidUserID) {
				t.Fatalf("ValidateUserID(%q) = %v, want ErrInvalidUserID", tc.id, err)
			}
			// The ids of slots held already: the same, format and
			// invisible characters but for, which earlier releases
			// granted.
			held := tc.ok || strings.HasPrefix(tc.name, "format:") || strings.HasPrefix(tc.name, "invisible:")
			if err := ValidateHeldUserID(tc.id); held != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidUserID)) {
				t.Fatalf("ValidateHeldUserID(%q) = %v, want accepted %v", tc.id, err, held)
			}
		})
	}
}

// HeldUserKey reaches the key an earlier release gave a user id holding a
// format character, the key UserKey would give it were it accepted; the
// ids no release accepted it refuses as UserKey does.
func TestSchemaHeldUserKey(t *testing.T) {
	s := Schema{Prefix: "p:"}
	got, err := s.HeldUserKey("us\u200ber-42")
	if want := "p:{us\u200ber-42}"; err != nil || got != want {
		t.Fatalf("HeldUserKey = %q, %v; want %q", got, err, want)
	}
	if _, err := s.UserKey("us\u200ber-42"); !errors.Is(err, ErrInvalidUserID) {
		t.Fatalf("UserKey of a format character = %v, want ErrInvalidUserID", err)
	}
	plain, _ := s.UserKey("user-42")
	if got, err := s.HeldUserKey("user-42"); err != nil || got != plain {
		t.Fatalf("HeldUserKey(user-42) = %q, %v; want UserKey's %q", got, err, plain)
	}
	for _, id := range []string{"", "a}b", "a b", "a\x00b", strings.Repeat("a", 257)} {
		if _, err := s.HeldUserKey(id); !errors.Is(err, ErrInvalidUserID) {
			t.Errorf("HeldUserKey(%q) = %v, want ErrInvalidUserID", id, err)
		}
	}
}

// Every ASCII character is judged in an id as it is alone, whether it
// comes before or after a non-ASCII one (the byte-at-a-time and the
// rune-at-a-time checks).
func TestValidateUserIDJudgesEachCharacterAlike(t *testing.T) {
	for c := range rune(utf8.RuneSelf) {
		bad := c == '{' || c == '}' || unicode.IsSpace(c) || unicode.IsControl(c)
		for _, id := range []string{"a" + string(c) + "b", "é" + string(c), string(c) + "é"} {
			if err := ValidateUserID(id); (err != nil) != bad {
				t.Errorf("ValidateUserID(%q) = %v, want refused %t", id, err, bad)
			}
		}
	}
}

func TestValidateStreamID(t *testing.T) {
	for _, id := range []string{"s1", "a.b_c:d-e", strings.Repeat("z", 128), NewStreamID()} {
		if err := ValidateStreamID(id); err != nil {
			t.Errorf("ValidateStreamID(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range []string{"", strings.Repeat("z", 129), "a b", "a/b", "é", "a\nb"} {
		if err := ValidateStreamID(id); !errors.Is(err, ErrInvalidStreamID) {
			t.Errorf("ValidateStreamID(%q) = %v, want ErrInvalidStreamID", id, err)
		}
	}
}

func TestNewStreamIDIsRandom128Bit(t *testing.T) {
	a, b := NewStreamID(), NewStreamID()
	if len(a) != 32 || a == b {
		t.Fatalf("NewStreamID() = %q, %q: want two different 32-hex-digit ids", a, b)
	}
}

func TestSchemaUserKey(t *testing.T) {
	got, err := Schema{}.UserKey("u1")
	if err != nil || got != "joishi:streams:{u1}" {
		t.Fatalf("UserKey(u1) = %q, %v; want joishi:streams:{u1}", got, err)
	}
	got, _ = Schema{Prefix: "x:"}.UserKey("u1")
	if got != "x:{u1}" {
		t.Fatalf("UserKey with prefix x: = %q, want x:{u1}", got)
	}
	if _, err := (Schema{}).UserKey("a}b"); !errors.Is(err, ErrInvalidUserID) {
		t.Fatalf("UserKey(a}b) error = %v, want ErrInvalidUserID", err)
	}
	if got := SlotRecords("x:{u1}"); got != "x:{u1}:meta" || hashTag(got) != "u1" {
		t.Fatalf("SlotRecords(x:{u1}) = %q, want x:{u1}:meta, hashed like u1", got)
	}
	if got, err := ReleasedAnswer("x:{u1}", "3f2a9c1e5b7d4a60"); err != nil || got != "x:{u1}:released:3f2a9c1e5b7d4a60" || hashTag(got) != "u1" {
		t.Fatalf("ReleasedAnswer(x:{u1}, 3f2a...) = %q, %v; want x:{u1}:released:3f2a9c1e5b7d4a60, hashed like u1", got, err)
	}
	if answer, _ := ReleasedAnswer("x:{u1}", "c1"); !IsReleasedAnswer(answer) || IsReleasedAnswer("x:{u1}") || IsReleasedAnswer("x:{a:released:b}") || IsReleasedAnswer(SlotRecords("x:{u1}")) {
		t.Fatalf("IsReleasedAnswer: want true only for a name ReleasedAnswer builds")
	}
	for _, tc := range []struct{ got, want string }{
		{Queue("x:{u1}"), "x:{u1}:q"},
		{QueueExpiry("x:{u1}"), "x:{u1}:q:expiry"},
		{WakeChannel("x:{u1}"), "x:{u1}:wake"},
	} {
		if tc.got != tc.want || hashTag(tc.got) != "u1" {
			t.Errorf("got %q, want %q, hashed like u1", tc.got, tc.want)
		}
	}
	if !IsQueue(Queue("x:{u1}")) || !IsQueue(QueueExpiry("x:{u1}")) || IsQueue("x:{u1}") || IsQueue("x:{a:q}") || IsQueue(SlotRecords("x:{u1}")) {
		t.Errorf("IsQueue: want true only for a name Queue or QueueExpiry builds")
	}
	for _, key := range []string{Queue("x:{u1}"), QueueExpiry("x:{u1}"), QueueRecords("x:{u1}")} {
		if got, ok := QueueOf(key); !ok || got != "x:{u1}" {
			t.Errorf("QueueOf(%s) = %q, %v; want x:{u1}, true", key, got, ok)
		}
	}
	if got, ok := QueueOf(SlotRecords("x:{u1}")); ok {
		t.Errorf("QueueOf(%s) = %q, true; want false", SlotRecords("x:{u1}"), got)
	}
	for _, id := range []string{"", "a}b", "a b", "é", strings.Repeat("a", 129)} {
		if _, err := ReleasedAnswer("x:{u1}", id); err == nil {
			t.Errorf("ReleasedAnswer(x:{u1}, %q) = nil error, want one", id)
		}
	}
	if err := ValidateKeyPrefix("bad{"); err == nil {
		t.Fatal("ValidateKeyPrefix(bad{) = nil, want an error")
	}
	if got := Override("x:{u1}"); got != "x:{u1}:override" || hashTag(got) != "u1" {
		t.Fatalf("Override(x:{u1}) = %q, want x:{u1}:override, hashed like u1", got)
	}
	if got := (Schema{Prefix: "x:"}).Overrides(); got != "x:overrides" {
		t.Fatalf("Overrides() = %q, want x:overrides", got)
	}
	if IsReleasedAnswer(Override("x:{u1}")) || !IsOverride(Override("x:{u1}")) || IsOverride("x:{u1}") || IsOverride(SlotRecords("x:{u1}")) || IsOverride("x:{a:override}") {
		t.Fatal("IsOverride: want true only for a name Override builds")
	}
}

func TestValidateLabel(t *testing.T) {
	cases := []struct {
		name  string
		label string
		want  string // "" accepted, else a part of the error
	}{
		{"empty: no label", "", ""},
		{"a pod name", "chat-api-7d9f8-x2k4q", ""},
		{"a model with a slash and an at", "meta-llama/Llama-3.1-8B@v2", ""},
		{"braces and separators, which never reach a key", "{a};b=c", ""},
		{"unicode letters", "モデル", ""},
		{"exactly 128 bytes", strings.Repeat("l", 128), ""},
		{"129 bytes names the limit", strings.Repeat("l", 129), "129 bytes, the limit is 128"},
		{"a space", "a b", "whitespace"},
		{"a newline", "a\nb", "whitespace"},
		{"a terminal escape", "a\x1b[2Jb", "control"},
		{"format: a bidirectional override", "a\u202eb", "format"},
		{"a Hangul filler names its code point", "pod\u3164", "invisible characters (found U+3164)"},
		{"a combining grapheme joiner", "a\u034fb", "U+034F"},
		{"an emoji variation selector", "\u2764\ufe0f", "U+FE0F"},
		{"a supplementary variation selector", "a\U000E0100", "U+E0100"},
		{"a braille blank", "a\u2800", "U+2800"},
		{"invalid UTF-8", "a\xffb", "UTF-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateLabel(tc.label)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("ValidateLabel(%q) = %v, want nil", tc.label, err)
			case tc.want != "" && (!errors.Is(err, ErrInvalidLabel) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("ValidateLabel(%q) = %v, want ErrInvalidLabel saying %q", tc.label, err, tc.want)
			}
		})
	}
}

// hashTag returns the part of key Redis Cluster hashes: the contents of the
// first {...} when non-empty, else the whole key.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}

func FuzzUserKeyHashTag(f *testing.F) {
	for _, seed := range []string{"u1", "a}b", "{x}", "", "a b", "a\nb", "\x00", "\xff", "ユーザー", strings.Repeat("a", 257), "}{", "{}"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		key, err := Schema{}.UserKey(id)
		if err != nil {
			if !errors.Is(err, ErrInvalidUserID) {
				t.Fatalf("UserKey(%q) error %v is not ErrInvalidUserID", id, err)
			}
			return
		}
		if tag := hashTag(key); tag != id {
			t.Fatalf("UserKey(%q) = %q, whose hash tag is %q, not the id", id, key, tag)
		}
	})
}

func TestCompanionsOfAreTheKeysEachBuilds(t *testing.T) {
	pool, err := Schema{Prefix: "x:"}.PoolKey("model", "gpt-4o")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"x:{u1}", "joishi:streams:{é-ü}", pool, "{}"} {
		got := CompanionsOf(key)
		want := Companions{SlotRecords: SlotRecords(key), Override: Override(key), Queue: Queue(key),
			QueueExpiry: QueueExpiry(key), QueueRecords: QueueRecords(key)}
		if got != want {
			t.Errorf("CompanionsOf(%q) = %+v, want %+v", key, got, want)
		}
	}
}
