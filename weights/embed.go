//go:build !webdraft_noembed

package weights

import "embed"

//go:embed drafter/config.json drafter/model.safetensors target/config.json target/model.safetensors
var files embed.FS

const embedded = true
