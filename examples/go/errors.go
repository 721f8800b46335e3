package clm

// #include <clm.h>
import "C"

import (
	"errors"
	"fmt"
	"runtime"
)

// Code is a clm_status: 0 (OK) or one of the negative CLM_ERR_* codes.
//
// A Code is also an error, so the constants below serve as errors.Is
// sentinels: errors.Is(err, clm.FailedPrecondition) is true for any *Error
// carrying that code.
type Code int32

const (
	OK                 Code = C.CLM_OK
	InvalidArgument    Code = C.CLM_ERR_INVALID_ARGUMENT
	OutOfMemory        Code = C.CLM_ERR_OUT_OF_MEMORY
	NotFound           Code = C.CLM_ERR_NOT_FOUND
	FailedPrecondition Code = C.CLM_ERR_FAILED_PRECONDITION
	Unsupported        Code = C.CLM_ERR_UNSUPPORTED
	Internal           Code = C.CLM_ERR_INTERNAL
	IO                 Code = C.CLM_ERR_IO
)

// String is the library's static name of the code (clm_status_name):
// "ok", "invalid_argument", ..., "unknown".
func (c Code) String() string { return C.GoString(C.clm_status_name(C.clm_status(c))) }

// Error makes a Code usable as a sentinel error.
func (c Code) Error() string { return "clm: " + c.String() }

// ErrClosed is wrapped by the *Error returned for a call on an Engine or Seq
// that was already closed (its code is FailedPrecondition).
var ErrClosed = errors.New("clm: use of a closed handle")

// Error is a failed clmcache call: the status code and the message that
// clm_last_error() gave for it on the calling thread.
type Error struct {
	code   Code
	op     string // the C function (or wrapper method) that failed
	msg    string // clm_last_error(), or the wrapper's own message
	closed bool   // the handle was closed on the Go side; the C library was not called
}

// Code is the clm_status of the failure.
func (e *Error) Code() Code { return e.code }

// Message is the library's description of the failure (never empty).
func (e *Error) Message() string { return e.msg }

// Op is the C function or wrapper method that failed.
func (e *Error) Op() string { return e.op }

func (e *Error) Error() string {
	return fmt.Sprintf("clm: %s: %s (%s)", e.op, e.msg, e.code.String())
}

// Is matches a Code sentinel with the same value, ErrClosed for calls on a
// closed handle, and another *Error with the same code.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case Code:
		return t == e.code
	case *Error:
		return t.code == e.code
	}
	return e.closed && target == ErrClosed
}

// Unwrap gives ErrClosed for calls on a closed handle.
func (e *Error) Unwrap() error {
	if e.closed {
		return ErrClosed
	}
	return nil
}

// CodeOf is the Code carried by err: OK for nil, Internal for an error that
// did not come from this package.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.code
	}
	var c Code
	if errors.As(err, &c) {
		return c
	}
	return Internal
}

// call runs f, which makes one C call returning a clm_status, and turns a
// failure into an *Error. clm_last_error() is thread-local, so the goroutine
// is pinned to its OS thread from the C call until the message is read.
func call(op string, f func() C.clm_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	status := f()
	if status == C.CLM_OK {
		return nil
	}
	msg := C.GoString(C.clm_last_error())
	if msg == "" {
		msg = "(no message)"
	}
	return &Error{code: Code(status), op: op, msg: msg}
}

func closedError(op, what string) error {
	return &Error{code: FailedPrecondition, op: op, msg: "the " + what + " was closed", closed: true}
}
