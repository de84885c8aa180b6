package tiers

// Table is the set of tiers in force, by plan (see Catalog).
type Table = Catalog[Tier]

// NewTable returns an empty table that has not synced yet.
func NewTable() *Table { return NewCatalog[Tier]() }

// Name is the tier's key in a Table: its plan.
func (t Tier) Name() string { return t.Plan }
