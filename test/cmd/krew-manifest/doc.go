// Command krew-manifest renders the krew plugin manifest template (hack/krew/gpuslice.yaml) for a
// release tag as krew-release-bot does — .TagName set, each addURIAndSha call replaced by the
// archive's uri and sha256 — hashing the archives make krew built instead of downloading them,
// and checks the result against krew's rules for a plugin manifest before writing it:
//
//	krew-manifest --template hack/krew/gpuslice.yaml --tag v0.1.0 --archives _output/krew --out _output/krew/gpuslice.yaml
package main
