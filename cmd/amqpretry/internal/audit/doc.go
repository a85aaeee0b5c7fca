// Package audit writes the CLI's audit log: open it with Open before an
// action, so that a log that cannot be written stops the action, and Record
// one line per action, the same JSON line the console writes
// (console.AuditEntry).
package audit
