// Command etcd is the upstream etcd server (go.etcd.io/etcd/server/v3, the version the test module
// pins), built from Go modules so that the local cluster needs no system package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
