module rsm-e2e.local/standin

go 1.26.0
