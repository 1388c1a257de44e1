package sampling

// Fault exposes the deliberate mistakes of the multi-draft rule to the
// external tests, which show that their goodness-of-fit check catches each.
type Fault = fault

const (
	FaultIgnoreQ    = faultIgnoreQ
	FaultKeepQ      = faultKeepQ
	FaultBonusFromP = faultBonusFromP
)

// SetFault makes ver run the rule with f.
func (ver *Verifier) SetFault(f Fault) { ver.fault = f }
