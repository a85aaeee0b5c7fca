package console

import (
	"strings"
	"unicode/utf8"
)

// maxSignature bounds a group's signature, in bytes: messages that agree on
// their first kilobyte, once normalised, have the same cause.
const maxSignature = 1024

// Normalize reduces an exception message (or a stack trace) to the
// signature its group is known by: the parts that differ from one message
// to the next are collapsed, so "order 1234 not found" and "order 98 not
// found" are one cause. UUIDs become <uuid>; hex ids (0x1f, a run of 8 or
// more hex digits with a digit in it: a hash, an object id, an address)
// become <hex>; every other run of digits becomes <n> (so 3.14 is <n>.<n>,
// item42 is item<n>); runs of white space become one space. The result is
// cut at maxSignature bytes, on a character boundary.
//
// Words are runs of ASCII letters and digits; everything else (punctuation,
// non-ASCII letters) is kept as it is, so the signature still reads as the
// message did.
func Normalize(s string) string {
	var b strings.Builder
	b.Grow(min(len(s), maxSignature))
	space := false // a white-space run is pending
	for i := 0; i < len(s) && b.Len() < maxSignature; {
		c := s[i]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' {
			space = true
			i++
			continue
		}
		if space {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			space = false
		}
		if !isAlnum(c) {
			_, n := utf8.DecodeRuneInString(s[i:])
			b.WriteString(s[i : i+n])
			i += n
			continue
		}
		if isUUID(s[i:]) {
			b.WriteString("<uuid>")
			i += 36
			continue
		}
		end := i
		for end < len(s) && isAlnum(s[end]) {
			end++
		}
		writeWord(&b, s[i:end])
		i = end
	}
	out := b.String()
	if len(out) > maxSignature {
		cut := maxSignature
		for cut > 0 && !utf8.RuneStart(out[cut]) {
			cut--
		}
		out = out[:cut]
	}
	return out
}

// writeWord writes one run of ASCII letters and digits, normalised.
func writeWord(b *strings.Builder, w string) {
	if len(w) > 2 && w[0] == '0' && (w[1] == 'x' || w[1] == 'X') && allHex(w[2:]) {
		b.WriteString("<hex>")
		return
	}
	if len(w) >= 8 && allHex(w) && hasDigit(w) && !allDigits(w) {
		b.WriteString("<hex>")
		return
	}
	for i := 0; i < len(w); {
		if isDigit(w[i]) {
			for i < len(w) && isDigit(w[i]) {
				i++
			}
			b.WriteString("<n>")
			continue
		}
		b.WriteByte(w[i])
		i++
	}
}

// isUUID reports whether s starts with a UUID (8-4-4-4-12 hex digits) that
// is not the middle of a longer word.
func isUUID(s string) bool {
	if len(s) < 36 {
		return false
	}
	for i := range 36 {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isHex(s[i]) {
				return false
			}
		}
	}
	return len(s) == 36 || !isAlnum(s[36])
}

func isAlnum(c byte) bool { return isDigit(c) || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') }
func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isHex(c byte) bool   { return isDigit(c) || ('a' <= c && c <= 'f') || ('A' <= c && c <= 'F') }

func allHex(s string) bool {
	for i := range len(s) {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for i := range len(s) {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

func hasDigit(s string) bool {
	for i := range len(s) {
		if isDigit(s[i]) {
			return true
		}
	}
	return false
}
