//go:build e2e

// Package oracle is precise mode's byte oracle for the e2e tests: random
// histories on real images, every snapshot read back in full through
// librbd, and every mode's answer (object, exact, precise and its
// variants: Modes) judged against those bytes. A mode must report every
// byte that is non-zero (Allocated) or differs (Delta); what it reports
// beyond that is its cost, summed per mode and per kind of history into
// the table TestPreciseOracle prints. Precise mode's walk variants
// (Options.Walk) answer only the queries where precise mode walked, on
// an image without a usable object map: elsewhere they take its path, and
// would only repeat its answer.
//
// A seed makes one history (NewWorkload, Workload.Run) and replays it
// exactly: RSM_E2E_SEED=n replays seed n, RSM_E2E_SEEDS=n runs n seeds
// (Seeds). The histories are made of named scenarios (scenarios.go): the
// shapes a seed picks (Shapes) and the steps of its random histories
// (Steps). Workload.Check runs the queries and judges them; Migrate and
// RemoveDuring add the migration and concurrent removal scenarios.
//
// The tests that use it are precise_*_test.go and concurrent_removal_test.go
// in package e2e; like e2e/harness, on which it builds, it builds only with
// the e2e tag.
package oracle
