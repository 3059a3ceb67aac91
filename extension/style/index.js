import './base.css';
import './outputs.css';
import './cells.css';
