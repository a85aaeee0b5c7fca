package console

import (
	"strings"
	"testing"
)

func TestViewBody(t *testing.T) {
	big := strings.Repeat("é", maxBodyShown) // two bytes each
	for _, tc := range []struct {
		name, body, asked, kind, contains string
		notShown                          int
	}{
		{"JSON pretty-printed", `{"a":[1,2],"b":"\u202e"}`, "", "json", "{\n  \"a\": [\n    1,", 0},
		{"JSON as text when asked", `{"a":1}`, "text", "text", `{"a":1}`, 0},
		{"a raw bidi override in JSON escaped", "{\"a\":\"\u202e\"}", "", "json", `"a": "\u202e"`, 0},
		{"text escaped, line breaks kept", "line one\r\n\x1b[2Jtwo", "", "text", "line one\\r\n\\x1b[2Jtwo", 0},
		{"not UTF-8 as hex", "\xff\xfe\x00\x01abc", "", "hex", "ff fe 00 01 61 62 63", 0},
		{"hex when asked", "abc", "hex", "hex", "61 62 63", 0},
		{"a big body cut", big, "", "text", "éé", len(big) - maxBodyShown},
	} {
		v := viewBody([]byte(tc.body), tc.asked)
		if v.Kind != tc.kind || !strings.Contains(v.Text, tc.contains) || v.NotShown != tc.notShown || v.Size != len(tc.body) {
			t.Errorf("%s: kind %s, not shown %d, text %.80q", tc.name, v.Kind, v.NotShown, v.Text)
		}
		if strings.ContainsAny(v.Text, "\u202e\x1b\x00\r") {
			t.Errorf("%s: raw control characters in %q", tc.name, v.Text)
		}
	}
}

func TestNum(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 10000: "10,000", 1234567: "1,234,567", -4200: "-4,200"} {
		if got := num(n); got != want {
			t.Errorf("num(%d) = %q, want %q", n, got, want)
		}
	}
}

// A form's "back" field redirects within the console only.
func TestLocalPath(t *testing.T) {
	for back, want := range map[string]string{
		"/":                    "/",
		"/?by=stack":           "/?by=stack",
		"/group?q=a&g=b":       "/group?q=a&g=b",
		"//evil.example/":      "/",
		"https://evil.example": "/",
		"/\\evil.example":      "/",
		"javascript:alert(1)":  "/",
		"group":                "/",
		"/x\r\nSet-Cookie: a":  "/",
	} {
		if got := localPath(back); got != want {
			t.Errorf("localPath(%q) = %q, want %q", back, got, want)
		}
	}
}
