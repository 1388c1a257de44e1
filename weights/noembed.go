//go:build webdraft_noembed

package weights

import "testing/fstest"

// files is empty: this build carries no weights.
var files = fstest.MapFS{}

const embedded = false
