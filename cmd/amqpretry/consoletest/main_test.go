package consoletest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"
)

// RequireEnv is the variable that turns a missing browser into a failure
// (make test sets it, as AMQPRETRY_REQUIRE_BROKER for the broker).
const RequireEnv = "AMQPRETRY_REQUIRE_BROWSER"

var (
	// chromium is the browser's path, "" when none was found.
	chromium string
	// command is the amqpretry binary the tests start.
	command string

	browserOnce   sync.Once
	browserCtx    context.Context // the browser every test opens its own context in
	browserCancel context.CancelFunc
	browserErr    error
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	chromium = findChromium()
	if chromium == "" && os.Getenv(RequireEnv) == "1" {
		fmt.Fprintln(os.Stderr, "consoletest: no Chromium found ($AMQPRETRY_CHROMIUM, chromium, chromium-browser, google-chrome): run scripts/chromium.sh")
		return 1
	}
	dir, err := os.MkdirTemp("", "amqpretry-consoletest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if chromium != "" {
		// The command, built from the source beside this module.
		command = filepath.Join(dir, "amqpretry")
		build := exec.Command("go", "build", "-o", command, ".")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "consoletest: go build of the command: %v\n%s", err, out)
			return 1
		}
	}
	code := m.Run()
	if browserCancel != nil {
		browserCancel()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "consoletest: goroutines outlived the tests: %v\n", err)
			return 1
		}
	}
	return code
}

// findChromium is $AMQPRETRY_CHROMIUM, else the first Chromium or Chrome on
// $PATH, as scripts/chromium.sh looks for it.
func findChromium() string {
	for _, name := range []string{os.Getenv("AMQPRETRY_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"} {
		if name == "" {
			continue
		}
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	return ""
}

// needBrowser skips the test without a browser (TestMain has failed the
// run already under make test).
func needBrowser(t *testing.T) {
	t.Helper()
	if chromium == "" {
		t.Skip("no Chromium: run scripts/chromium.sh (make test fails here instead: " + RequireEnv + "=1)")
	}
}

// browser returns a fresh browser context (its own cookies, as a private
// window) in the shared headless browser, closed when the test ends.
// Without a browser the test skips, or fails under make test.
func browser(t *testing.T) context.Context {
	t.Helper()
	needBrowser(t)
	browserOnce.Do(startBrowser)
	if browserErr != nil {
		t.Fatalf("start %s: %v", chromium, browserErr)
	}
	// A browser context of its own, in a window of its own: headless
	// Chromium refuses a tab in a context without a window, which
	// chromedp.WithNewBrowserContext asks for.
	var contextID cdp.BrowserContextID
	var targetID target.ID
	err := chromedp.Run(browserCtx, chromedp.ActionFunc(func(ctx context.Context) error {
		b := cdp.WithExecutor(ctx, chromedp.FromContext(ctx).Browser)
		var err error
		if contextID, err = target.CreateBrowserContext().Do(b); err != nil {
			return err
		}
		targetID, err = target.CreateTarget("about:blank").WithBrowserContextID(contextID).WithNewWindow(true).Do(b)
		return err
	}))
	if err != nil {
		t.Fatalf("a browser context: %v", err)
	}
	ctx, cancel := chromedp.NewContext(browserCtx, chromedp.WithTargetID(targetID))
	t.Cleanup(func() {
		cancel()
		_ = chromedp.Run(browserCtx, chromedp.ActionFunc(func(ctx context.Context) error {
			return target.DisposeBrowserContext(contextID).Do(cdp.WithExecutor(ctx, chromedp.FromContext(ctx).Browser))
		}))
	})
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("a browser context: %v", err)
	}
	return ctx
}

// startBrowser starts headless Chromium, as root allows and the closed
// network needs: no sandbox, no GPU, no QUIC, no background requests, a
// profile of its own. Two names resolve to this machine, as a DNS rebinding
// attack and another site would have them.
func startBrowser() {
	profile, err := os.MkdirTemp("", "amqpretry-chromium-")
	if err != nil {
		browserErr = err
		return
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(profile),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		// No HTTPS upgrade of http://rebind.test/ (it would wait for a TLS
		// port that is not there), besides the defaults' own.
		chromedp.Flag("disable-features", "site-per-process,Translate,BlinkGenPropertyTrees,HttpsUpgrades,HttpsFirstBalancedModeAutoEnable"),
		chromedp.Flag("host-resolver-rules", "MAP "+rebindHost+" 127.0.0.1, MAP "+otherSite+" 127.0.0.1"),
		chromedp.WindowSize(1280, 900),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	browserCtx = ctx
	browserCancel = func() {
		cancel()
		cancelAlloc() // waits for the browser to exit
		_ = os.RemoveAll(profile)
	}
	browserErr = chromedp.Run(ctx)
}
