// Package errtext turns an error that may come from user code into text that
// is safe to log, put on a span or write into a header: call String wherever
// such an error is formatted.
//
// A handler may return anything that implements error, including a typed nil
// pointer (var e *MyErr; return e) whose Error method dereferences its
// receiver, and text that is not UTF-8. Formatting one with err.Error() would
// panic outside any recover and take the process down, and the message would
// crash-loop the service.
package errtext
