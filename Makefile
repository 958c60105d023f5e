# For those who have make: each target is the dev.sh command of the same name,
# which holds the build tags and the install steps in one place.
.PHONY: demo test unit e2e build deps lint
demo test unit e2e build deps lint:
	./dev.sh $@
