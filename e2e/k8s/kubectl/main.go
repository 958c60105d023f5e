// kubectl, built from k8s.io/kubectl at the version pinned in go.mod (the
// API server's): the same main as k8s.io/kubernetes/cmd/kubectl. The deploy
// test (e2e/k8s_deploy_test.go) applies the examples with it as a user does.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
