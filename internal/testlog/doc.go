// Package testlog gives tests a log destination they can read while the
// code under test writes to it from other goroutines.
package testlog
