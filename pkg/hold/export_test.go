package hold

// SetCloseCut sets a function Close calls as it cuts each stream, until
// the returned function undoes it.
func SetCloseCut(f func(*Stream)) (undo func()) {
	closeCut = f
	return func() { closeCut = nil }
}
