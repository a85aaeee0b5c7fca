// Package errtree looks into error trees as the errors package does, without
// allocating on the way: errors.As moves its target to the heap, and the
// library asks its questions of every failed delivery.
package errtree
