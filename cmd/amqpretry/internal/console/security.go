package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// contentSecurityPolicy allows the console's own style sheet and images,
// forms posting to itself, and nothing else: no script at all, no inline
// style, no frames around it, no <base>.
const contentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'"

// securityHeaders are on every response, error pages included.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store") // pages hold message contents
}

// NewToken returns a random token of 32 characters (192 bits).
func NewToken() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// cookieName is the session cookie's name.
const cookieName = "amqpretry_console"

// sessionLifetime is how long a session lasts after the token bought it.
const sessionLifetime = 12 * time.Hour

// session is what a token bought: a cookie naming it and a CSRF token for
// its forms.
type session struct {
	id      string
	who     string // the token's name
	csrf    string
	expires time.Time
}

// authenticator holds the tokens (as hashes, compared in constant time)
// and the sessions they bought.
type authenticator struct {
	tokens map[string][32]byte // name → SHA-256 of the token
	secure bool

	mu       sync.Mutex
	sessions map[string]*session
}

func newAuthenticator(tokens map[string]string, secure bool) *authenticator {
	a := &authenticator{tokens: make(map[string][32]byte, len(tokens)), secure: secure, sessions: make(map[string]*session)}
	for name, token := range tokens {
		a.tokens[name] = sha256.Sum256([]byte(token))
	}
	return a
}

// check returns the name of token, ok false if it is none of the console's.
// Every token is compared, in constant time, so the time taken says nothing.
func (a *authenticator) check(token string) (name string, ok bool) {
	sum := sha256.Sum256([]byte(token))
	for n, want := range a.tokens {
		if subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
			name, ok = n, true
		}
	}
	return name, ok
}

// login starts a session for the token's holder and sets its cookie.
func (a *authenticator) login(w http.ResponseWriter, who string) *session {
	s := &session{id: NewToken() + NewToken(), who: who, csrf: NewToken(), expires: time.Now().Add(sessionLifetime)}
	a.mu.Lock()
	now := time.Now()
	for id, old := range a.sessions {
		if now.After(old.expires) {
			delete(a.sessions, id)
		}
	}
	a.sessions[s.id] = s
	a.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.id, Path: "/", HttpOnly: true, Secure: a.secure,
		SameSite: http.SameSiteStrictMode, Expires: s.expires})
	return s
}

// logout ends r's session.
func (a *authenticator) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(cookieName); err == nil {
		a.mu.Lock()
		delete(a.sessions, c.Value)
		a.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", HttpOnly: true, Secure: a.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
}

// session is r's session, nil if it has none that is valid.
func (a *authenticator) session(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sessions[c.Value]
	if s == nil || time.Now().After(s.expires) {
		return nil
	}
	return s
}

// hostSet is the Host header values the console answers to.
type hostSet map[string]bool

// allowedHosts is the names the console may be reached as, listening on
// addr: the address itself; for a loopback address localhost and the other
// loopback spellings; for a wildcard address this machine's addresses and
// host name; and extra, each as given and, without a port, with addr's.
func allowedHosts(addr *net.TCPAddr, extra []string) hostSet {
	port := strconv.Itoa(addr.Port)
	hosts := hostSet{}
	add := func(host string) {
		host = strings.ToLower(strings.TrimSuffix(host, "."))
		hosts[net.JoinHostPort(host, port)] = true
		if port == "80" || port == "443" {
			hosts[host] = true
		}
	}
	switch {
	case addr.IP.IsLoopback():
		for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
			add(h)
		}
		add(addr.IP.String())
	case addr.IP.IsUnspecified():
		for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
			add(h)
		}
		if ifaces, err := net.InterfaceAddrs(); err == nil {
			for _, a := range ifaces {
				if ipnet, ok := a.(*net.IPNet); ok {
					add(ipnet.IP.String())
				}
			}
		}
	default:
		add(addr.IP.String())
	}
	for _, h := range extra {
		if _, _, err := net.SplitHostPort(h); err == nil {
			hosts[strings.ToLower(h)] = true
			continue
		}
		add(strings.Trim(h, "[]"))
	}
	return hosts
}

// allows reports whether host, a Host header, is one of the set.
func (s hostSet) allows(host string) bool {
	host = strings.ToLower(host)
	if h, p, err := net.SplitHostPort(host); err == nil {
		host = net.JoinHostPort(strings.TrimSuffix(h, "."), p)
	}
	return s[host]
}

// sameOrigin reports whether a state-changing request comes from the
// console's own pages, as browsers tell: Sec-Fetch-Site, which a page
// cannot set, must be same-origin (a page on another port of the same host
// is same-site, and would carry a SameSite=Strict cookie along) or none (the
// user's own doing, not a page's). A browser too old to send it sends
// Origin, which must then be this scheme and Host. A client that sends
// neither is not a browser acting for a page. The CSRF token is checked
// besides.
//
// Origin alone cannot decide: under Referrer-Policy: no-referrer (the
// console's) a browser sends "Origin: null" with a form POST of the
// console's own page.
func sameOrigin(r *http.Request, https bool) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin" || site == "none"
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	scheme := "http"
	if https {
		scheme = "https"
	}
	// "null" (an opaque origin: a sandboxed frame, a data: page) has no
	// scheme and fails here.
	return u.Scheme == scheme && strings.EqualFold(u.Host, r.Host) && u.Path == "" && u.User == nil
}

// validCSRF reports whether the form's csrf field is the session's token.
func validCSRF(s *session, got string) bool {
	return subtle.ConstantTimeCompare([]byte(s.csrf), []byte(got)) == 1
}
