// Package consoletest drives `amqpretry console` in a real browser: headless
// Chromium (scripts/chromium.sh installs Debian's package), through
// chromedp. It fills a DLQ through a real listener, builds the command,
// starts it and clicks through its pages: the groups and their counts, a
// group replayed back to the work queue and handled there, the
// confirmations of delete and purge, read-only mode, and the refusals (no
// token, a cross-origin POST, a foreign Host, hostile text shown inert). It
// saves screenshots of the pages to $AMQPRETRY_SCREENSHOTS when set.
//
// It is a module of its own so that chromedp stays out of the command's
// go.mod, and make test runs it once, on one broker. Without a browser its
// tests skip, unless AMQPRETRY_REQUIRE_BROWSER=1 (make test), which makes
// them fail.
package consoletest
