package driver

// Reference is the pager's naive reference, for the gRPC-level tests.
var Reference = reference

// CheckPages is the pager's invariant check, for the gRPC-level tests.
var CheckPages = checkPages
